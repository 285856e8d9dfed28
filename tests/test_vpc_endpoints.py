"""VPC endpoints: the S3 gateway endpoint on by default (S3 reads and ECR's image layers skip the NAT
gateway's per-GB charge), interface endpoints as a priced option, and the team egress policy with them."""

from __future__ import annotations

import ipaddress

import pytest

from config import costs, vpc_endpoints
from config.settings import load_settings
from k8s.builders import tenants as tn
from tests.conftest import dev_config, run_config, stack_file

ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


def _endpoints(run):
    return {r.name: r for r in run.by_type(ENDPOINT)}


def test_the_s3_gateway_endpoint_is_on_by_default_on_every_private_route_table():
    run = run_config(dev_config())
    found = _endpoints(run)
    assert set(found) == {"net-s3"}, "interface endpoints are an option, off by default"
    s3 = found["net-s3"]
    assert s3.inputs["vpcEndpointType"] == "Gateway" and s3.inputs["serviceName"] == "com.amazonaws.us-west-2.s3"
    private_rts = {r.state.get("id") or r.id for r in run.by_type("aws:ec2/routeTable:RouteTable") if "private" in r.name}
    assert private_rts and set(s3.inputs["routeTableIds"]) == private_rts
    assert not _endpoints(run_config(dev_config(network={"s3GatewayEndpoint": False})))


def test_interface_endpoints_cover_every_service_the_nodes_call_in_the_private_subnets():
    run = run_config(dev_config(network={"interfaceEndpoints": True}))
    found = _endpoints(run)
    interface = {r.inputs["serviceName"].rsplit("us-west-2.", 1)[1]: r for r in found.values() if r.inputs["vpcEndpointType"] == "Interface"}
    assert set(interface) == set(vpc_endpoints.INTERFACE_SERVICES)
    assert {"ecr.api", "ecr.dkr", "sts", "ec2", "sqs", "ssm", "eks-auth"} <= set(interface)  # image pulls, Karpenter, Pod Identity
    private = {r.id for r in run.by_type("aws:ec2/subnet:Subnet") if "private" in r.name}
    sgs = {r.id: r for r in run.by_type("aws:ec2/securityGroup:SecurityGroup")}
    for ep in interface.values():
        assert ep.inputs["privateDnsEnabled"] is True and set(ep.inputs["subnetIds"]) == private
        (sg,) = ep.inputs["securityGroupIds"]
        rules = sgs[sg].inputs["ingress"]
        assert [(r["fromPort"], r["toPort"], r["protocol"], r["cidrBlocks"]) for r in rules] == [(443, 443, "tcp", [run.one("aws:ec2/vpc:Vpc").inputs["cidrBlock"]])]


def test_with_interface_endpoints_teams_reach_them_on_https_and_nothing_else_private():
    cfg = stack_file("teams")["config"]
    cfg = {**cfg, "training-platform:network": {**cfg.get("training-platform:network", {}), "interfaceEndpoints": True}}
    run = run_config(cfg, stack="teams")
    policies = [r for r in run.registrations if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy" and r.inputs["metadata"]["name"] == "egress" and tn.TEAM_LABEL in r.inputs["metadata"].get("labels", {})]
    assert policies
    enis = sum(len(r.state.get("networkInterfaceIds") or []) for r in run.by_type(ENDPOINT))
    for p in policies:
        https = [rule for rule in p.inputs["spec"]["egress"] if rule.get("ports") == [{"protocol": "TCP", "port": 443}]]
        assert len(https) == 1 and https[0]["to"], "an empty 'to' would reach every address"
        cidrs = [peer["ipBlock"]["cidr"] for peer in https[0]["to"]]
        assert all(c.endswith("/32") and ipaddress.ip_network(c).is_private for c in cidrs)
        assert len(cidrs) == enis
    # without the option the policy has no such rule (S3 goes through the gateway endpoint to its public addresses)
    plain = run_config(stack_file("teams")["config"], stack="teams")
    for p in [r for r in plain.registrations if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy" and r.inputs["metadata"]["name"] == "egress" and tn.TEAM_LABEL in r.inputs["metadata"].get("labels", {})]:
        assert not [rule for rule in p.inputs["spec"]["egress"] if rule.get("ports") == [{"protocol": "TCP", "port": 443}]]


def test_endpoint_peers_are_never_empty():
    assert tn.endpoint_peers(["10.0.1.5", "10.0.1.5", "10.0.2.7"]) == [{"ipBlock": {"cidr": "10.0.1.5/32"}}, {"ipBlock": {"cidr": "10.0.2.7/32"}}]
    with pytest.raises(ValueError):
        tn.endpoint_peers([])


def test_an_existing_vpc_refuses_interface_endpoints_in_one_line():
    from tools.mock_runtime import ProgramError

    with pytest.raises(ProgramError) as err:
        run_config(dev_config(network={"vpcId": "vpc-0abc12345def67890", "privateSubnetIds": ["subnet-0a1b2c3d4e5f60718", "subnet-0a1b2c3d4e5f60719"], "interfaceEndpoints": True}))
    lines = [x for x in str(err.value).splitlines() if "interfaceEndpoints" in x]
    assert len(lines) == 1 and "existing VPC" in lines[0]


def test_make_cost_prices_the_endpoints():
    table = costs.prices()
    assert (table.interface_endpoint_per_az_hour, table.endpoint_per_gb) == (0.01, 0.01)
    s = load_settings({"network": {"interfaceEndpoints": True, "azCount": 3}}, stack="t", region="us-east-1")
    est = costs.estimate(s)
    lines = {line.what: line for line in est.always_on}
    assert lines["S3 gateway endpoint"].total == 0.0
    (iface,) = [line for what, line in lines.items() if what.startswith("interface endpoints")]
    assert iface.count == len(vpc_endpoints.INTERFACE_SERVICES) * 3 and iface.total == pytest.approx(0.01 * len(vpc_endpoints.INTERFACE_SERVICES) * 3)
    text = costs.render(est)
    assert "S3 gateway endpoint" in text and "$0.01 per GB processed" in text


def test_an_interface_endpoint_gets_only_the_subnets_of_zones_its_service_serves():
    from tests.conftest import PROJECT
    from tools.mock_runtime import run_program

    run = run_program(str(PROJECT), "dev", stack_config={"config": dev_config(network={"interfaceEndpoints": True, "availabilityZones": ["us-west-2a", "us-west-2b"]})},
                      endpoint_zones={"sqs": ["us-west-2b", "us-west-2c"]})
    subnets = {r.id: r.inputs["availabilityZone"] for r in run.by_type("aws:ec2/subnet:Subnet") if "private" in r.name}
    by_service = {r.inputs["serviceName"].rsplit("us-west-2.", 1)[1]: r for r in run.by_type(ENDPOINT) if r.inputs["vpcEndpointType"] == "Interface"}
    assert [subnets[s] for s in by_service["sqs"].inputs["subnetIds"]] == ["us-west-2b"]
    assert sorted(subnets[s] for s in by_service["sts"].inputs["subnetIds"]) == ["us-west-2a", "us-west-2b"]
