"""AWS side of GPU capacity: Karpenter's IAM, interruption queue and rules (self-managed mode),
and EFA's placement group and security group."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

import versions
from config import aws_facts, costs
from config.names import IAM_ROLE, PLACEMENT_GROUP, SQS_QUEUE
from config.settings import Settings
from infra.cluster import NODE_POLICIES, Cluster
from infra.iam import assume_role_policy
from infra.project_config import offline_render
from k8s.builders.gpu_objects import KARPENTER_NAMESPACE, KARPENTER_SERVICE_ACCOUNT

# EventBridge events that announce a node going away; Karpenter drains ahead of them. The five
# rules of Karpenter's reference CloudFormation (v1.14, see karpenter_controller_policies).
INTERRUPTION_EVENTS = {
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "capacity-reservation-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]},
}
EFA_SG_TAG = "training-platform/efa"


def aws_partition(region: str) -> str:
    """The ARN partition of a region: aws-cn for China, aws-us-gov for GovCloud, else aws."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def aws_url_suffix(region: str) -> str:
    return aws_facts.dns_suffix(aws_partition(region))


def karpenter_node_role_name(cluster_name: str) -> str:
    return IAM_ROLE.name(cluster_name, "karpenter-node")


def karpenter_controller_role_name(cluster_name: str) -> str:
    return IAM_ROLE.name(cluster_name, "karpenter-controller")


def interruption_queue_name(cluster_name: str) -> str:
    return SQS_QUEUE.name(cluster_name, "karpenter")


def efa_placement_group_name(cluster_name: str) -> str:
    return PLACEMENT_GROUP.name(cluster_name, "efa")


def karpenter_controller_policies(*, cluster_name: str, region: str, account: str, node_role_arn: str, queue_arn: str) -> dict[str, dict]:
    """The controller's permissions, statement for statement those of Karpenter's reference
    CloudFormation for v1.14 (aws/karpenter-provider-aws,
    website/content/en/v1.14/getting-started/getting-started-with-karpenter/cloudformation.yaml),
    grouped as its six managed policies and with the same Sids. Only the values differ: our
    cluster, region, partition, account, node role and queue.

    Launching, tagging and deleting are limited to resources tagged for this cluster (and a
    NodePool / EC2NodeClass); PassRole to the one node role; reads to this region, except the
    Pricing API, which is served from us-east-1 and so must not carry a region condition.

    Nothing is kept stricter than the reference: each narrower variant we had could deny a call
    Karpenter makes (pricing under a region condition, no launch-template statement), and the
    reference is already scoped to the cluster's tags and the node role."""
    partition = aws_partition(region)
    ec2 = f"arn:{partition}:ec2:{region}"
    profiles = f"arn:{partition}:iam::{account}:instance-profile/*"
    cluster_arn = f"arn:{partition}:eks:{region}:{account}:cluster/{cluster_name}"
    owned_tag = f"kubernetes.io/cluster/{cluster_name}"
    tagged_launch = [f"{ec2}:*:{r}/*" for r in ("fleet", "instance", "volume", "network-interface", "launch-template", "spot-instances-request")]
    launch_actions = ["ec2:RunInstances", "ec2:CreateFleet"]
    request_owned = {f"aws:RequestTag/{owned_tag}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name}
    resource_owned = {f"aws:ResourceTag/{owned_tag}": "owned"}
    any_nodepool = {"aws:ResourceTag/karpenter.sh/nodepool": "*"}

    def allow(sid: str, actions: str | list[str], resource: str | list[str], condition: dict | None = None) -> dict:
        stmt = {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resource}
        if condition:
            stmt["Condition"] = condition
        return stmt

    def doc(*statements: dict) -> dict:
        return {"Version": "2012-10-17", "Statement": list(statements)}

    return {
        "node-lifecycle": doc(
            allow(
                "AllowScopedEC2InstanceAccessActions",
                launch_actions,
                [f"{ec2}::image/*", f"{ec2}::snapshot/*", f"{ec2}:*:security-group/*", f"{ec2}:*:subnet/*", f"{ec2}:*:capacity-reservation/*", f"{ec2}:*:placement-group/*"],
            ),
            # Launching from an existing (Karpenter-made) launch template is authorised against
            # the template's own tags; without this statement CreateFleet is denied.
            allow("AllowScopedEC2LaunchTemplateAccessActions", launch_actions, f"{ec2}:*:launch-template/*", {"StringEquals": resource_owned, "StringLike": any_nodepool}),
            allow(
                "AllowScopedEC2InstanceActionsWithTags",
                [*launch_actions, "ec2:CreateLaunchTemplate"],
                tagged_launch,
                {"StringEquals": request_owned, "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}},
            ),
            allow(
                "AllowScopedResourceCreationTagging",
                "ec2:CreateTags",
                tagged_launch,
                {"StringEquals": {**request_owned, "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]}, "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}},
            ),
            allow(
                "AllowScopedResourceTagging",
                "ec2:CreateTags",
                f"{ec2}:*:instance/*",
                {
                    "StringEquals": resource_owned,
                    "StringLike": any_nodepool,
                    "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                    "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]},
                },
            ),
            allow(
                "AllowScopedDeletion",
                ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
                {"StringEquals": resource_owned, "StringLike": any_nodepool},
            ),
        ),
        "iam-integration": doc(
            allow("AllowPassingInstanceRole", "iam:PassRole", node_role_arn, {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}),
            allow(
                "AllowScopedInstanceProfileCreationActions",
                "iam:CreateInstanceProfile",
                profiles,
                {
                    "StringEquals": {**request_owned, "aws:RequestTag/topology.kubernetes.io/region": region},
                    "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
                },
            ),
            allow(
                "AllowScopedInstanceProfileTagActions",
                "iam:TagInstanceProfile",
                profiles,
                {
                    "StringEquals": {
                        **resource_owned,
                        "aws:ResourceTag/topology.kubernetes.io/region": region,
                        **request_owned,
                        "aws:RequestTag/topology.kubernetes.io/region": region,
                    },
                    "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*", "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
                },
            ),
            allow(
                "AllowScopedInstanceProfileActions",
                ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
                profiles,
                {"StringEquals": {**resource_owned, "aws:ResourceTag/topology.kubernetes.io/region": region}, "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"}},
            ),
        ),
        "eks-integration": doc(allow("AllowAPIServerEndpointDiscovery", "eks:DescribeCluster", cluster_arn)),
        "interruption": doc(allow("AllowInterruptionQueueActions", ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"], queue_arn)),
        "zonal-shift": doc(
            allow("AllowZonalShiftStatusReadOnly", "arc-zonal-shift:GetManagedResource", "*", {"StringEquals": {"arc-zonal-shift:ResourceIdentifier": cluster_arn}}),
        ),
        "resource-discovery": doc(
            allow(
                "AllowRegionalReadActions",
                [
                    "ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                ],
                "*",
                {"StringEquals": {"aws:RequestedRegion": region}},
            ),
            allow("AllowSSMReadActions", "ssm:GetParameter", f"arn:{partition}:ssm:{region}::parameter/aws/service/*"),
            # No region condition: the Pricing API answers from us-east-1 whatever our region.
            allow("AllowPricingReadActions", "pricing:GetProducts", "*"),
            allow("AllowUnscopedInstanceProfileListAction", "iam:ListInstanceProfiles", "*"),
            allow("AllowInstanceProfileReadActions", "iam:GetInstanceProfile", profiles),
        ),
    }


# The reference's six managed policies, in its order (keys of karpenter_controller_policies).
CONTROLLER_POLICY_GROUPS = ("node-lifecycle", "iam-integration", "eks-integration", "interruption", "zonal-shift", "resource-discovery")
# IAM: a managed policy may hold at most 6,144 characters, whitespace not counted (IAM and STS quotas).
MANAGED_POLICY_MAX_CHARS = 6144


def karpenter_controller_policy(**kwargs: str) -> dict:
    """All of ``karpenter_controller_policies`` as one document, for inspection and tests: it is
    too large to be one managed policy, so the component creates one policy per group."""
    return {"Version": "2012-10-17", "Statement": [s for d in karpenter_controller_policies(**kwargs).values() for s in d["Statement"]]}


def interruption_queue_policy(*, queue_arn: str, rule_arns: list[str]) -> dict:
    """The interruption queue's policy: the reference CloudFormation's (EventBridge and SQS may
    send, nothing without TLS), with EventBridge's grant scoped to this stack's rules: without
    ``aws:SourceArn`` any account's rule could target the queue and have Karpenter drain nodes
    on forged interruption events (EventBridge User Guide, "Using resource-based policies for
    Amazon EventBridge", Amazon SQS permissions: ``ArnEquals`` ``aws:SourceArn`` = the rule ARN)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "EventBridge", "Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"}, "Action": "sqs:SendMessage", "Resource": queue_arn, "Condition": {"ArnEquals": {"aws:SourceArn": sorted(rule_arns)}}},
            {"Sid": "SQS", "Effect": "Allow", "Principal": {"Service": "sqs.amazonaws.com"}, "Action": "sqs:SendMessage", "Resource": queue_arn},
            {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        ],
    }


def pod_identity_trust() -> str:
    return json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]}
    )


SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE_PATH = f"/aws-service-role/{SPOT_SERVICE}/"  # IAM's path for a service's linked roles (IAM User Guide, "Using service-linked roles")


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
        # In Auto Mode too: Auto Mode runs the agent on its own nodes only, and the managed node
        # groups' pods (the CloudWatch agent) need it there; the add-on keeps off Auto Mode's nodes
        # (config/node_agents.yaml)
        self.pod_identity_agent = aws.eks.Addon(
            f"{name}-pod-identity-agent",
            cluster_name=cluster.eks_cluster.eks_cluster.name,
            addon_name="eks-pod-identity-agent",
            addon_version=versions.POD_IDENTITY_ADDON_VERSION,
            opts=self._opts(depends_on=list(cluster.node_groups.values())),
        )
        if "spot" in settings.gpu_pool.capacity_types:
            self._ensure_spot_service_linked_role(name)
        self._check_quotas()
        if settings.gpu_pool.mode == "karpenter":
            self._tag_security_group(name)
            self._create_karpenter_node_role(name)
            self._create_interruption_queue(name)
            self._create_controller_identity(name)
            if settings.efa.enabled:
                self._create_efa(name)
        self.register_outputs({"queueName": self.queue_name, "nodeRoleName": self.node_role_name})

    def _ensure_spot_service_linked_role(self, name: str) -> None:
        """EC2 launches spot capacity only in an account that has the EC2 Spot service-linked role
        (``AWSServiceRoleForEC2Spot``, path ``/aws-service-role/spot.amazonaws.com/``). EC2 User Guide,
        "Service-linked role for Spot Instance requests": EC2 creates it the first time spot is
        requested from the console; a request through the API needs it to exist first. Karpenter's
        getting-started guide says the same ("If this is the first time using spot instances in this
        account, you need to create the service linked role"), and the controller policy this stack renders grants no
        iam:CreateServiceLinkedRole. The account is asked at deploy (IAM ListRoles by that path): a
        role that exists is left alone, one that does not is created and kept on destroy (the
        account's other users of spot need it, and a role that exists cannot be created twice)."""
        found = aws.iam.get_roles(path_prefix=SPOT_ROLE_PATH, opts=pulumi.InvokeOptions(parent=self))
        if found.names:
            return
        aws.iam.ServiceLinkedRole(f"{name}-spot-service-linked-role", aws_service_name=SPOT_SERVICE, opts=self._opts(retain_on_delete=True))

    def _check_quotas(self) -> None:
        """One warning per EC2 on-demand vCPU quota (Service Quotas, by the quota's name) below what
        the enabled jobs need at once (config/costs.py quota_needs): their nodes would never launch.
        Quotas that cannot be read (no servicequotas grant) are named once with what is needed (not
        in an offline render, which has no account); the deploy goes on either way (a job waits)."""
        unread = []
        for quota, vcpus in sorted(costs.quota_needs(self._s).items()):
            try:
                have = aws.servicequotas.get_service_quota(service_code="ec2", quota_name=quota, opts=pulumi.InvokeOptions(parent=self)).value
            except Exception as err:  # noqa: BLE001 - a quota that cannot be read is said, not fatal
                reason = (str(err).strip().splitlines() or [type(err).__name__])[-1].rpartition(" failed: ")[2]
                unread.append(f"{quota!r} ({vcpus} vCPUs needed; {reason})")
                continue
            if have < vcpus:
                pulumi.log.warn(f"EC2 quota {quota!r} is {have:g} vCPUs in {self._s.region}; the enabled jobs need {vcpus} at once: "
                                f"ask for an increase in Service Quotas, or their nodes never launch", self)
        if unread and not offline_render():  # offline no account is there to read: nothing to say
            pulumi.log.warn("EC2 quotas not read, check them in Service Quotas: " + "; ".join(unread), self)

    @property
    def node_role_arns(self) -> list[pulumi.Output[str]]:
        """The role Karpenter's nodes run as (self-managed mode; none in Auto Mode)."""
        return [self.node_role.arn] if self.node_role_name else []

    def _opts(self, **kw) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kw)

    def _tag_security_group(self, name: str) -> None:
        aws.ec2.Tag(f"{name}-sg-discovery", resource_id=self._cluster.security_group_id, key="karpenter.sh/discovery", value=self._cluster.name, opts=self._opts())

    def _create_karpenter_node_role(self, name: str) -> None:
        self.node_role_name = karpenter_node_role_name(self._cluster.name)
        region = self._s.region
        role = aws.iam.Role(
            f"{name}-karpenter-node", name=self.node_role_name, assume_role_policy=assume_role_policy(f"ec2.{aws_url_suffix(region)}"), tags=self._tags, opts=self._opts()
        )
        for key, arn in NODE_POLICIES.items():
            arn = arn.replace("arn:aws:", f"arn:{aws_partition(region)}:", 1)  # AWS-managed policies live in every partition
            # Karpenter starts (and launches nodes as this role) once the role has its policies:
            # a node whose role lacks them cannot register (EKS User Guide, "Amazon EKS node IAM role")
            self.karpenter_ready.append(aws.iam.RolePolicyAttachment(f"{name}-karpenter-node-{key}", role=role.name, policy_arn=arn, opts=self._opts()))
        entry = aws.eks.AccessEntry(
            f"{name}-karpenter-node", cluster_name=self._cluster.eks_cluster.eks_cluster.name, principal_arn=role.arn, type="EC2_LINUX", opts=self._opts(depends_on=[self._cluster.eks_cluster])
        )
        self.node_role = role
        self.karpenter_ready.append(entry)

    def _create_interruption_queue(self, name: str) -> None:
        """Karpenter's interruption queue as in the reference CloudFormation: 300 s retention,
        SQS-managed encryption (which EventBridge can deliver to: infra/encryption.py), one
        EventBridge rule per INTERRUPTION_EVENTS entry targeting it; the queue policy lets
        EventBridge send for these rules only (see interruption_queue_policy), and each target
        waits for it, so no event is routed to a queue that would refuse it."""
        self.queue_name = interruption_queue_name(self._cluster.name)
        queue = aws.sqs.Queue(f"{name}-interruptions", name=self.queue_name, message_retention_seconds=300, sqs_managed_sse_enabled=True, tags=self._tags, opts=self._opts())
        rules = {key: aws.cloudwatch.EventRule(f"{name}-{key}", event_pattern=json.dumps(pattern), tags=self._tags, opts=self._opts()) for key, pattern in INTERRUPTION_EVENTS.items()}
        access = aws.sqs.QueuePolicy(
            f"{name}-interruptions",
            queue_url=queue.url,
            policy=pulumi.Output.all(queue.arn, *[r.arn for r in rules.values()]).apply(lambda a: json.dumps(interruption_queue_policy(queue_arn=a[0], rule_arns=list(a[1:])))),
            opts=self._opts(),
        )
        for key, rule in rules.items():
            target = aws.cloudwatch.EventTarget(f"{name}-{key}", rule=rule.name, arn=queue.arn, target_id="karpenter-interruption-queue", opts=self._opts(depends_on=[access]))
            self.karpenter_ready.append(target)
        self.queue = queue

    def _create_controller_identity(self, name: str) -> None:
        ident = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(parent=self))
        docs = pulumi.Output.all(ident.account_id, self.node_role.arn, self.queue.arn).apply(
            lambda a: karpenter_controller_policies(cluster_name=self._cluster.name, region=self._s.region, account=a[0], node_role_arn=a[1], queue_arn=a[2])
        )
        role = aws.iam.Role(
            f"{name}-karpenter-controller", name=karpenter_controller_role_name(self._cluster.name), assume_role_policy=pod_identity_trust(), tags=self._tags, opts=self._opts()
        )
        # One managed policy per group of the reference: all statements in one document exceed
        # IAM's 6,144-character limit for a managed policy.
        for group in CONTROLLER_POLICY_GROUPS:
            policy = aws.iam.Policy(
                f"{name}-karpenter-controller-{group}", policy=docs.apply(lambda d, g=group: json.dumps(d[g])), tags=self._tags, opts=self._opts()
            )
            attachment = aws.iam.RolePolicyAttachment(f"{name}-karpenter-controller-{group}", role=role.name, policy_arn=policy.arn, opts=self._opts())
            # Karpenter starts only once it has its permissions, and keeps them until it is gone
            # (it terminates its nodes while being destroyed).
            self.karpenter_ready.append(attachment)
        cluster_name = self._cluster.eks_cluster.eks_cluster.name
        agent = self.pod_identity_agent
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

