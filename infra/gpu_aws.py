"""AWS side of GPU capacity: Karpenter's IAM, interruption queue and rules (self-managed mode),
and EFA's placement group and security group."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.cluster import NODE_POLICIES, Cluster
from infra.iam import assume_role_policy
from infra.settings import Settings
from k8s.gpu_objects import KARPENTER_NAMESPACE, KARPENTER_SERVICE_ACCOUNT

# EventBridge events that announce a node going away; Karpenter drains ahead of them.
INTERRUPTION_EVENTS = {
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
}
EFA_SG_TAG = "training-platform/efa"


def karpenter_node_role_name(cluster_name: str) -> str:
    return f"{cluster_name}-karpenter-node"[:64]


def efa_placement_group_name(cluster_name: str) -> str:
    return f"{cluster_name}-efa"


def karpenter_controller_policy(*, cluster_name: str, region: str, account: str, node_role_arn: str, queue_arn: str) -> dict:
    """Least privilege for the controller: it may only launch, tag and terminate instances and
    launch templates tagged for this cluster, pass only the GPU node role, and read its queue."""
    owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name}
    ec2 = f"arn:aws:ec2:{region}"
    launch_targets = [f"{ec2}:*:{r}/*" for r in ("fleet", "instance", "volume", "network-interface", "launch-template", "spot-instances-request")]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadOnly",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeAvailabilityZones", "ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups",
                    "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets", "pricing:GetProducts",
                ],
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
            },
            {"Sid": "AmiParameters", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": f"arn:aws:ssm:{region}::parameter/aws/service/*"},
            {
                "Sid": "LaunchFromSharedResources",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": [f"{ec2}::image/*", f"{ec2}::snapshot/*", f"{ec2}:*:security-group/*", f"{ec2}:*:subnet/*", f"{ec2}:*:capacity-reservation/*", f"{ec2}:*:placement-group/*"],
            },
            {
                "Sid": "LaunchTaggedForCluster",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                "Resource": launch_targets,
                "Condition": {"StringEquals": owned, "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}},
            },
            {
                "Sid": "TagOnLaunch",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": launch_targets,
                "Condition": {"StringEquals": {**owned, "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]}},
            },
            {
                "Sid": "TagOwnInstances",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": f"{ec2}:*:instance/*",
                "Condition": {
                    "StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"},
                    "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                    "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]},
                },
            },
            {
                "Sid": "DeleteOwn",
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
                "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}},
            },
            {
                "Sid": "PassNodeRole",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_role_arn,
                "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com"]}},
            },
            {
                "Sid": "InstanceProfilesForCluster",
                "Effect": "Allow",
                "Action": ["iam:CreateInstanceProfile", "iam:TagInstanceProfile", "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
                "Resource": f"arn:aws:iam::{account}:instance-profile/*",
                "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned", "aws:ResourceTag/topology.kubernetes.io/region": region}},
            },
            {
                "Sid": "CreateInstanceProfilesForCluster",
                "Effect": "Allow",
                "Action": ["iam:CreateInstanceProfile", "iam:TagInstanceProfile"],
                "Resource": f"arn:aws:iam::{account}:instance-profile/*",
                "Condition": {"StringEquals": {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned", "aws:RequestTag/topology.kubernetes.io/region": region}},
            },
            {"Sid": "ReadInstanceProfiles", "Effect": "Allow", "Action": ["iam:GetInstanceProfile", "iam:ListInstanceProfiles"], "Resource": "*"},
            {"Sid": "Cluster", "Effect": "Allow", "Action": "eks:DescribeCluster", "Resource": f"arn:aws:eks:{region}:{account}:cluster/{cluster_name}"},
            {"Sid": "InterruptionQueue", "Effect": "Allow", "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"], "Resource": queue_arn},
        ],
    }


def pod_identity_trust() -> str:
    return json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]}
    )


class GpuAws(pulumi.ComponentResource):
    queue_name: str | None
    node_role_name: str | None
    placement_group_name: str | None

    def __init__(self, name: str, *, settings: Settings, cluster: Cluster, vpc_id: pulumi.Input[str], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:GpuAws", name, None, opts)
        self._s = settings
        self._vpc_id = vpc_id
        self._cluster = cluster
        self._tags = tags
        self.queue_name = self.node_role_name = self.placement_group_name = None
        self.karpenter_ready: list[pulumi.Resource] = []
        if settings.gpu_pool.mode == "karpenter":
            self._tag_security_group(name)
            self._create_karpenter_node_role(name)
            self._create_interruption_queue(name)
            self._create_controller_identity(name)
            if settings.efa.enabled:
                self._create_efa(name)
        self.register_outputs({"queueName": self.queue_name, "nodeRoleName": self.node_role_name})

    def _opts(self, **kw) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kw)

    def _tag_security_group(self, name: str) -> None:
        aws.ec2.Tag(f"{name}-sg-discovery", resource_id=self._cluster.security_group_id, key="karpenter.sh/discovery", value=self._cluster.name, opts=self._opts())

    def _create_karpenter_node_role(self, name: str) -> None:
        self.node_role_name = karpenter_node_role_name(self._cluster.name)
        role = aws.iam.Role(f"{name}-karpenter-node", name=self.node_role_name, assume_role_policy=assume_role_policy("ec2.amazonaws.com"), tags=self._tags, opts=self._opts())
        for key, arn in NODE_POLICIES.items():
            aws.iam.RolePolicyAttachment(f"{name}-karpenter-node-{key}", role=role.name, policy_arn=arn, opts=self._opts())
        entry = aws.eks.AccessEntry(
            f"{name}-karpenter-node", cluster_name=self._cluster.eks_cluster.eks_cluster.name, principal_arn=role.arn, type="EC2_LINUX", opts=self._opts(depends_on=[self._cluster.eks_cluster])
        )
        self.node_role = role
        self.karpenter_ready.append(entry)

    def _create_interruption_queue(self, name: str) -> None:
        self.queue_name = f"{self._cluster.name}-karpenter"[:80]
        queue = aws.sqs.Queue(f"{name}-interruptions", name=self.queue_name, message_retention_seconds=300, sqs_managed_sse_enabled=True, tags=self._tags, opts=self._opts())
        aws.sqs.QueuePolicy(
            f"{name}-interruptions",
            queue_url=queue.url,
            policy=queue.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {"Sid": "EventBridge", "Effect": "Allow", "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]}, "Action": "sqs:SendMessage", "Resource": arn},
                            {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
                        ],
                    }
                )
            ),
            opts=self._opts(),
        )
        for key, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(f"{name}-{key}", event_pattern=json.dumps(pattern), tags=self._tags, opts=self._opts())
            target = aws.cloudwatch.EventTarget(f"{name}-{key}", rule=rule.name, arn=queue.arn, target_id="karpenter-interruption-queue", opts=self._opts())
            self.karpenter_ready.append(target)
        self.queue = queue

    def _create_controller_identity(self, name: str) -> None:
        ident = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(parent=self))
        policy_doc = pulumi.Output.all(ident.account_id, self.node_role.arn, self.queue.arn).apply(
            lambda a: json.dumps(karpenter_controller_policy(cluster_name=self._cluster.name, region=self._s.region, account=a[0], node_role_arn=a[1], queue_arn=a[2]))
        )
        role = aws.iam.Role(f"{name}-karpenter-controller", name=f"{self._cluster.name}-karpenter-controller"[:64], assume_role_policy=pod_identity_trust(), tags=self._tags, opts=self._opts())
        policy = aws.iam.Policy(f"{name}-karpenter-controller", policy=policy_doc, tags=self._tags, opts=self._opts())
        aws.iam.RolePolicyAttachment(f"{name}-karpenter-controller", role=role.name, policy_arn=policy.arn, opts=self._opts())
        cluster_name = self._cluster.eks_cluster.eks_cluster.name
        agent = aws.eks.Addon(f"{name}-pod-identity-agent", cluster_name=cluster_name, addon_name="eks-pod-identity-agent", opts=self._opts(depends_on=list(self._cluster.node_groups.values())))
        assoc = aws.eks.PodIdentityAssociation(
            f"{name}-karpenter", cluster_name=cluster_name, namespace=KARPENTER_NAMESPACE, service_account=KARPENTER_SERVICE_ACCOUNT, role_arn=role.arn, opts=self._opts(depends_on=[agent])
        )
        self.karpenter_ready.append(assoc)

    def _create_efa(self, name: str) -> None:
        """EFA needs one AZ, a cluster placement group and a security group that allows all
        traffic to and from itself (the cluster group's default egress to 0.0.0.0/0 is not enough)."""
        self.placement_group_name = efa_placement_group_name(self._cluster.name)
        pg = aws.ec2.PlacementGroup(f"{name}-efa", name=self.placement_group_name, strategy="cluster", tags=self._tags, opts=self._opts())
        sg = aws.ec2.SecurityGroup(
            f"{name}-efa",
            vpc_id=self._vpc_id,
            description="EFA: all traffic within the group",
            tags={**self._tags, EFA_SG_TAG: self._cluster.name},
            opts=self._opts(),
        )
        aws.vpc.SecurityGroupIngressRule(f"{name}-efa-in-self", security_group_id=sg.id, referenced_security_group_id=sg.id, ip_protocol="-1", description="EFA from itself", opts=self._opts())
        aws.vpc.SecurityGroupEgressRule(f"{name}-efa-out-self", security_group_id=sg.id, referenced_security_group_id=sg.id, ip_protocol="-1", description="EFA to itself", opts=self._opts())
        self.efa_resources = [pg, sg]

