"""Network: a VPC with public and private subnets across AZs, or an existing VPC."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from config import vpc_endpoints
from config.names import LOG_GROUP
from config.settings import NetworkSettings, subnet_plan  # noqa: F401  (subnet_plan: part of this module's interface)
from infra.iam import assume_role_policy


def pick_zones(available: list[str], required: list[str], count: int) -> list[str]:
    """The zones the VPC spans: every zone something is pinned to (EFA pool, jobs), then the
    region's first zones."""
    missing = [z for z in required if z not in available]
    if missing:
        raise ValueError(f"availability zones {missing} are not available in this region (available: {available})")
    return (required + [z for z in available if z not in required])[:count]


def private_subnet_tags(cluster_name: str) -> dict[str, str]:
    return {
        "kubernetes.io/role/internal-elb": "1",
        "karpenter.sh/discovery": cluster_name,
        f"kubernetes.io/cluster/{cluster_name}": "shared",
    }


def public_subnet_tags(cluster_name: str) -> dict[str, str]:
    return {"kubernetes.io/role/elb": "1", f"kubernetes.io/cluster/{cluster_name}": "shared"}


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    public_subnet_ids: pulumi.Output[list[str]]
    availability_zones: pulumi.Output[list[str]]
    endpoint_ips: pulumi.Output[list[str]]

    def __init__(self, name: str, *, settings: NetworkSettings, cluster_name: str, tags: dict[str, str], required_zones: list[str] | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:Network", name, None, opts)
        self._settings = settings
        self._required_zones = list(dict.fromkeys(required_zones or []))
        self._cluster_name = cluster_name
        self._tags = tags
        if settings.create_vpc:
            self._create_vpc(name)
        else:
            self._use_existing(name)
        self.register_outputs(
            {"vpcId": self.vpc_id, "privateSubnetIds": self.private_subnet_ids, "publicSubnetIds": self.public_subnet_ids}
        )

    def _child(self) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self)

    def _zones(self) -> pulumi.Output[list[str]]:
        s = self._settings
        if s.availability_zones:
            return pulumi.Output.from_input(list(s.availability_zones))
        found = aws.get_availability_zones_output(state="available", opts=pulumi.InvokeOptions(parent=self))
        return found.names.apply(lambda names: pick_zones(sorted(names), self._required_zones, s.az_count))

    def _create_vpc(self, name: str) -> None:
        s = self._settings
        zones = self._zones()
        private_cidrs, public_cidrs = subnet_plan(s.cidr, s.az_count)
        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=s.cidr, enable_dns_hostnames=True, enable_dns_support=True, tags={**self._tags, "Name": f"{self._cluster_name}-vpc"}, opts=self._child())
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={**self._tags, "Name": f"{self._cluster_name}-igw"}, opts=self._child())
        public_rt = aws.ec2.RouteTable(
            f"{name}-public-rt", vpc_id=vpc.id, routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)], tags={**self._tags, "Name": f"{self._cluster_name}-public"}, opts=self._child()
        )
        public, private = [], []
        for i in range(s.az_count):
            az = zones.apply(lambda z, i=i: z[i])
            pub = aws.ec2.Subnet(
                f"{name}-public-{i}", vpc_id=vpc.id, cidr_block=public_cidrs[i], availability_zone=az, map_public_ip_on_launch=False,
                tags={**self._tags, **public_subnet_tags(self._cluster_name), "Name": f"{self._cluster_name}-public-{i}"}, opts=self._child(),
            )
            aws.ec2.RouteTableAssociation(f"{name}-public-{i}", subnet_id=pub.id, route_table_id=public_rt.id, opts=self._child())
            priv = aws.ec2.Subnet(
                f"{name}-private-{i}", vpc_id=vpc.id, cidr_block=private_cidrs[i], availability_zone=az, map_public_ip_on_launch=False,
                tags={**self._tags, **private_subnet_tags(self._cluster_name), "Name": f"{self._cluster_name}-private-{i}"}, opts=self._child(),
            )
            public.append(pub)
            private.append(priv)
        nat_count = s.az_count if s.nat_gateways == "perAz" else 1
        nats = []
        for i in range(nat_count):
            eip = aws.ec2.Eip(f"{name}-nat-{i}", domain="vpc", tags={**self._tags, "Name": f"{self._cluster_name}-nat-{i}"}, opts=self._child())
            nats.append(
                aws.ec2.NatGateway(
                    f"{name}-nat-{i}", allocation_id=eip.id, subnet_id=public[i].id, tags={**self._tags, "Name": f"{self._cluster_name}-nat-{i}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
                )
            )
        private_rts = []
        for i, priv in enumerate(private):
            nat = nats[i if s.nat_gateways == "perAz" else 0]
            rt = aws.ec2.RouteTable(
                f"{name}-private-rt-{i}", vpc_id=vpc.id, routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
                tags={**self._tags, "Name": f"{self._cluster_name}-private-{i}"}, opts=self._child(),
            )
            aws.ec2.RouteTableAssociation(f"{name}-private-{i}", subnet_id=priv.id, route_table_id=rt.id, opts=self._child())
            private_rts.append(rt)
        if s.flow_log_retention_days:
            self._create_flow_logs(name, vpc)
        self.endpoint_ips = self._create_endpoints(name, vpc, private, private_rts)
        self.vpc = vpc
        self.vpc_id = vpc.id
        self.private_subnet_ids = pulumi.Output.all(*[p.id for p in private])
        self.public_subnet_ids = pulumi.Output.all(*[p.id for p in public])
        self.availability_zones = zones

    def _service(self, service: str, kind: str) -> aws.ec2.AwaitableGetVpcEndpointServiceResult:
        """The Region's endpoint service as EC2 DescribeVpcEndpointServices gives it: its name
        (``com.amazonaws.<region>.<service>``, or the China Regions' own form) and the zones it serves."""
        return aws.ec2.get_vpc_endpoint_service_output(service=service, service_type=kind, opts=pulumi.InvokeOptions(parent=self))  # type: ignore[return-value]

    def _service_name(self, service: str, kind: str) -> pulumi.Output[str]:
        return self._service(service, kind).service_name  # type: ignore[attr-defined]

    def _create_endpoints(self, name: str, vpc: aws.ec2.Vpc, private: list[aws.ec2.Subnet], private_rts: list[aws.ec2.RouteTable]) -> pulumi.Output[list[str]]:
        """The S3 gateway endpoint on the private route tables, and with ``interfaceEndpoints`` an
        interface endpoint (private DNS, HTTPS from the VPC only) per service of
        config/vpc_endpoints.py in the private subnets; the interface endpoints' private addresses
        (what a team's egress policy lets its pods reach on HTTPS: k8s/builders/tenants.py)."""
        s = self._settings
        if s.s3_gateway_endpoint:
            aws.ec2.VpcEndpoint(
                f"{name}-s3", vpc_id=vpc.id, service_name=self._service_name(vpc_endpoints.GATEWAY_SERVICE, "Gateway"), vpc_endpoint_type="Gateway",
                route_table_ids=[rt.id for rt in private_rts], tags={**self._tags, "Name": f"{self._cluster_name}-s3"}, opts=self._child(),
            )
        if not s.interface_endpoints:
            return pulumi.Output.from_input([])
        sg = aws.ec2.SecurityGroup(
            f"{name}-endpoints", vpc_id=vpc.id, description="HTTPS from the VPC to its interface endpoints",
            ingress=[aws.ec2.SecurityGroupIngressArgs(protocol="tcp", from_port=vpc_endpoints.HTTPS_PORT, to_port=vpc_endpoints.HTTPS_PORT, cidr_blocks=[s.cidr], description="HTTPS from the VPC")],
            tags={**self._tags, "Name": f"{self._cluster_name}-endpoints"}, opts=self._child(),
        )
        enis: list[pulumi.Output[Sequence[str]]] = []
        for service in vpc_endpoints.INTERFACE_SERVICES:
            found = self._service(service, "Interface")
            # only the private subnets of zones the service serves: CreateVpcEndpoint refuses a subnet of
            # another ("The VPC endpoint service ... does not support the Availability Zone of the subnet")
            served = pulumi.Output.all(found.availability_zones, *[pulumi.Output.all(p.id, p.availability_zone) for p in private]).apply(  # type: ignore[attr-defined]
                lambda a: [sid for sid, zone in a[1:] if zone in (a[0] or [])])
            endpoint = aws.ec2.VpcEndpoint(
                f"{name}-{service.replace('.', '-')}", vpc_id=vpc.id, service_name=found.service_name, vpc_endpoint_type="Interface",  # type: ignore[attr-defined]
                private_dns_enabled=True, subnet_ids=served, security_group_ids=[sg.id], tags={**self._tags, "Name": f"{self._cluster_name}-{service}"}, opts=self._child(),
            )
            enis.append(endpoint.network_interface_ids)

        def addresses(ids: Sequence[str]) -> pulumi.Output[list[str]]:
            found = [aws.ec2.get_network_interface_output(id=i, opts=pulumi.InvokeOptions(parent=self)).private_ip for i in ids]
            return pulumi.Output.all(*found).apply(lambda ips: sorted(ips))

        return pulumi.Output.all(*enis).apply(lambda lists: addresses(sorted(i for ids in lists for i in ids)))

    def _create_flow_logs(self, name: str, vpc: aws.ec2.Vpc) -> None:
        """All accepted and rejected traffic to CloudWatch Logs, written by a role that can write
        only to this log group."""
        group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs", name=LOG_GROUP.name("/vpc", self._cluster_name, "flow-logs", sep="/"), retention_in_days=self._settings.flow_log_retention_days, tags=self._tags, opts=self._child()
        )
        role = aws.iam.Role(f"{name}-flow-logs", assume_role_policy=assume_role_policy("vpc-flow-logs.amazonaws.com"), tags=self._tags, opts=self._child())
        aws.iam.RolePolicy(
            f"{name}-flow-logs",
            role=role.id,
            policy=group.arn.apply(
                lambda arn: json.dumps(
                    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"], "Resource": [arn, f"{arn}:*"]}]}
                )
            ),
            opts=self._child(),
        )
        aws.ec2.FlowLog(f"{name}-flow-logs", vpc_id=vpc.id, traffic_type="ALL", log_destination_type="cloud-watch-logs", log_destination=group.arn, iam_role_arn=role.arn, tags=self._tags, opts=self._child())

    def _use_existing(self, name: str) -> None:
        """Bring-your-own VPC: nothing network-wide is created; the private subnets only get the
        tags Karpenter and the load balancer controller discover them by."""
        s = self._settings
        for i, subnet_id in enumerate(s.private_subnet_ids):
            for key, value in private_subnet_tags(self._cluster_name).items():
                aws.ec2.Tag(f"{name}-private-{i}-{key.replace('/', '-').replace('.', '-')}", resource_id=subnet_id, key=key, value=value, opts=self._child())
        assert s.vpc_id is not None, "bring-your-own VPC needs network.vpcId"  # settings.create_vpc is false
        self.vpc = None
        self.endpoint_ips = pulumi.Output.from_input([])  # an existing VPC's endpoints are its owner's
        self.vpc_id = pulumi.Output.from_input(s.vpc_id)
        self.private_subnet_ids = pulumi.Output.from_input(list(s.private_subnet_ids))
        self.public_subnet_ids = pulumi.Output.from_input(list(s.public_subnet_ids))
        if s.availability_zones:
            self.availability_zones = pulumi.Output.from_input(list(s.availability_zones))
        else:
            subnets = [aws.ec2.get_subnet_output(id=sid, opts=pulumi.InvokeOptions(parent=self)) for sid in s.private_subnet_ids]
            self.availability_zones = pulumi.Output.all(*[sn.availability_zone for sn in subnets])
