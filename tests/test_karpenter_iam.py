"""Karpenter controller IAM, interruption queue and rules: parity with Karpenter's reference.

REFERENCE below restates, statement by statement, the controller policies of Karpenter's
reference CloudFormation for v1.14:
    aws/karpenter-provider-aws, website/content/en/v1.14/getting-started/
    getting-started-with-karpenter/cloudformation.yaml
(read at tag v1.14.1, where the same template is website/content/en/preview/...; unchanged on
main's v1.14 directory). Placeholders stand for the template's parameters: {partition}, {region},
{account}, {cluster}, {node_role_arn} (KarpenterNodeRole.Arn), {queue_arn}
(KarpenterInterruptionQueue.Arn). The "policy" field names the template's managed policy.
"""

import json

import pytest

from infra.gpu_aws import (
    CONTROLLER_POLICY_GROUPS,
    INTERRUPTION_EVENTS,
    MANAGED_POLICY_MAX_CHARS,
    aws_partition,
    interruption_queue_name,
    karpenter_controller_policies,
    karpenter_controller_policy,
    karpenter_controller_role_name,
    karpenter_node_role_name,
)
from tests.conftest import run_stack
from tools.mock_runtime import ACCOUNT

_EC2 = "arn:{partition}:ec2:{region}"
_TAGGED_LAUNCH = [f"{_EC2}:*:{r}/*" for r in ("fleet", "instance", "volume", "network-interface", "launch-template", "spot-instances-request")]
_PROFILES = "arn:{partition}:iam::{account}:instance-profile/*"
_CLUSTER_ARN = "arn:{partition}:eks:{region}:{account}:cluster/{cluster}"

REFERENCE = {
    # NodeLifecyclePolicy
    "AllowScopedEC2InstanceAccessActions": {
        "policy": "node-lifecycle",
        "actions": {"ec2:RunInstances", "ec2:CreateFleet"},
        "resources": [f"{_EC2}::image/*", f"{_EC2}::snapshot/*", f"{_EC2}:*:security-group/*", f"{_EC2}:*:subnet/*", f"{_EC2}:*:capacity-reservation/*", f"{_EC2}:*:placement-group/*"],
        "condition": None,
    },
    "AllowScopedEC2LaunchTemplateAccessActions": {
        "policy": "node-lifecycle",
        "actions": {"ec2:RunInstances", "ec2:CreateFleet"},
        "resources": [f"{_EC2}:*:launch-template/*"],
        "condition": {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}},
    },
    "AllowScopedEC2InstanceActionsWithTags": {
        "policy": "node-lifecycle",
        "actions": {"ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"},
        "resources": _TAGGED_LAUNCH,
        "condition": {
            "StringEquals": {"aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned", "aws:RequestTag/eks:eks-cluster-name": "{cluster}"},
            "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
        },
    },
    "AllowScopedResourceCreationTagging": {
        "policy": "node-lifecycle",
        "actions": {"ec2:CreateTags"},
        "resources": _TAGGED_LAUNCH,
        "condition": {
            "StringEquals": {
                "aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned",
                "aws:RequestTag/eks:eks-cluster-name": "{cluster}",
                "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
            },
            "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
        },
    },
    "AllowScopedResourceTagging": {
        "policy": "node-lifecycle",
        "actions": {"ec2:CreateTags"},
        "resources": [f"{_EC2}:*:instance/*"],
        "condition": {
            "StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"},
            "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": "{cluster}"},
            "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]},
        },
    },
    "AllowScopedDeletion": {
        "policy": "node-lifecycle",
        "actions": {"ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"},
        "resources": [f"{_EC2}:*:instance/*", f"{_EC2}:*:launch-template/*"],
        "condition": {"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}},
    },
    # IAMIntegrationPolicy
    "AllowPassingInstanceRole": {
        "policy": "iam-integration",
        "actions": {"iam:PassRole"},
        "resources": ["{node_role_arn}"],
        "condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}},
    },
    "AllowScopedInstanceProfileCreationActions": {
        "policy": "iam-integration",
        "actions": {"iam:CreateInstanceProfile"},
        "resources": [_PROFILES],
        "condition": {
            "StringEquals": {
                "aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned",
                "aws:RequestTag/eks:eks-cluster-name": "{cluster}",
                "aws:RequestTag/topology.kubernetes.io/region": "{region}",
            },
            "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
        },
    },
    "AllowScopedInstanceProfileTagActions": {
        "policy": "iam-integration",
        "actions": {"iam:TagInstanceProfile"},
        "resources": [_PROFILES],
        "condition": {
            "StringEquals": {
                "aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned",
                "aws:ResourceTag/topology.kubernetes.io/region": "{region}",
                "aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned",
                "aws:RequestTag/eks:eks-cluster-name": "{cluster}",
                "aws:RequestTag/topology.kubernetes.io/region": "{region}",
            },
            "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*", "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
        },
    },
    "AllowScopedInstanceProfileActions": {
        "policy": "iam-integration",
        "actions": {"iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"},
        "resources": [_PROFILES],
        "condition": {
            "StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned", "aws:ResourceTag/topology.kubernetes.io/region": "{region}"},
            "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
        },
    },
    # EKSIntegrationPolicy
    "AllowAPIServerEndpointDiscovery": {"policy": "eks-integration", "actions": {"eks:DescribeCluster"}, "resources": [_CLUSTER_ARN], "condition": None},
    # InterruptionPolicy
    "AllowInterruptionQueueActions": {
        "policy": "interruption",
        "actions": {"sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"},
        "resources": ["{queue_arn}"],
        "condition": None,
    },
    # ZonalShiftPolicy
    "AllowZonalShiftStatusReadOnly": {
        "policy": "zonal-shift",
        "actions": {"arc-zonal-shift:GetManagedResource"},
        "resources": ["*"],
        "condition": {"StringEquals": {"arc-zonal-shift:ResourceIdentifier": _CLUSTER_ARN}},
    },
    # ResourceDiscoveryPolicy
    "AllowRegionalReadActions": {
        "policy": "resource-discovery",
        "actions": {
            "ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypeOfferings",
            "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory",
            "ec2:DescribeSubnets",
        },
        "resources": ["*"],
        "condition": {"StringEquals": {"aws:RequestedRegion": "{region}"}},
    },
    "AllowSSMReadActions": {"policy": "resource-discovery", "actions": {"ssm:GetParameter"}, "resources": ["arn:{partition}:ssm:{region}::parameter/aws/service/*"], "condition": None},
    "AllowPricingReadActions": {"policy": "resource-discovery", "actions": {"pricing:GetProducts"}, "resources": ["*"], "condition": None},
    "AllowUnscopedInstanceProfileListAction": {"policy": "resource-discovery", "actions": {"iam:ListInstanceProfiles"}, "resources": ["*"], "condition": None},
    "AllowInstanceProfileReadActions": {"policy": "resource-discovery", "actions": {"iam:GetInstanceProfile"}, "resources": [_PROFILES], "condition": None},
}

# The reference's five EventBridge rules (ScheduledChangeRule, SpotInterruptionRule,
# RebalanceRule, InstanceStateChangeRule, CapacityReservationInterruptionRule), each with the
# interruption queue as target.
REFERENCE_EVENT_PATTERNS = [
    {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    {"source": ["aws.ec2"], "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"]},
]

# Read-only API verbs; anything else counts as mutating.
_READ_PREFIXES = ("Describe", "Get", "List")

PARTITIONS = {"us-west-2": "aws", "us-east-1": "aws", "eu-central-1": "aws", "cn-north-1": "aws-cn", "cn-northwest-1": "aws-cn", "us-gov-west-1": "aws-us-gov"}


def _params(region: str, cluster: str = "training-dev") -> dict[str, str]:
    partition = PARTITIONS[region]
    return {
        "partition": partition,
        "region": region,
        "account": "123456789012",
        "cluster": cluster,
        "node_role_arn": f"arn:{partition}:iam::123456789012:role/{karpenter_node_role_name(cluster)}",
        "queue_arn": f"arn:{partition}:sqs:{region}:123456789012:{interruption_queue_name(cluster)}",
    }


def _ours(p: dict[str, str]) -> dict:
    return karpenter_controller_policy(cluster_name=p["cluster"], region=p["region"], account=p["account"], node_role_arn=p["node_role_arn"], queue_arn=p["queue_arn"])


def _fill(value, p: dict[str, str]):
    if isinstance(value, str):
        return value.format(**p)
    if isinstance(value, dict):
        return {_fill(k, p): _fill(v, p) for k, v in value.items()}
    if isinstance(value, list | set | tuple):
        return type(value)(_fill(v, p) for v in value)
    return value


def _as_set(value) -> set:
    return {value} if isinstance(value, str) else set(value)


def _norm_condition(cond: dict | None) -> dict:
    """operator -> key -> frozenset of values (a single string and a one-item list are equal)."""
    return {op: {k: frozenset(_as_set(v)) for k, v in keys.items()} for op, keys in (cond or {}).items()}


def _by_sid(policy: dict) -> dict[str, dict]:
    sids = [s["Sid"] for s in policy["Statement"]]
    assert len(sids) == len(set(sids)), f"duplicate Sids: {sids}"
    return {s["Sid"]: s for s in policy["Statement"]}


def _assert_parity(policy: dict, p: dict[str, str]) -> None:
    ours = _by_sid(policy)
    missing = sorted(set(REFERENCE) - set(ours))
    extra = sorted(set(ours) - set(REFERENCE))
    assert not missing, f"statements of the reference missing from our policy: {missing}"
    assert not extra, f"statements not in the reference: {extra}"
    for sid, ref in REFERENCE.items():
        stmt = ours[sid]
        assert stmt["Effect"] == "Allow", sid
        assert _as_set(stmt["Action"]) == ref["actions"], f"{sid}: actions differ: missing {ref['actions'] - _as_set(stmt['Action'])}, extra {_as_set(stmt['Action']) - ref['actions']}"
        assert _as_set(stmt["Resource"]) == set(_fill(ref["resources"], p)), f"{sid}: resources differ"
        assert _norm_condition(stmt.get("Condition")) == _norm_condition(_fill(ref["condition"], p)), f"{sid}: condition differs"


@pytest.mark.parametrize("region", sorted(PARTITIONS))
def test_policy_has_every_reference_statement_with_same_actions_resources_conditions(region):
    p = _params(region)
    _assert_parity(_ours(p), p)


def test_partition_follows_the_region():
    for region, partition in PARTITIONS.items():
        assert aws_partition(region) == partition
    cn = _ours(_params("cn-north-1"))
    assert all(r.startswith(("arn:aws-cn:", "*")) for s in cn["Statement"] for r in _as_set(s["Resource"]))


def test_parity_check_notices_a_dropped_statement_or_missing_action():
    p = _params("us-west-2")
    dropped = _ours(p)
    dropped["Statement"] = [s for s in dropped["Statement"] if s["Sid"] != "AllowScopedEC2LaunchTemplateAccessActions"]
    with pytest.raises(AssertionError, match="AllowScopedEC2LaunchTemplateAccessActions"):
        _assert_parity(dropped, p)
    short = _ours(p)
    for s in short["Statement"]:
        if s["Sid"] == "AllowRegionalReadActions":
            s["Action"] = [a for a in s["Action"] if a != "ec2:DescribeInstanceStatus"]
    with pytest.raises(AssertionError, match="DescribeInstanceStatus"):
        _assert_parity(short, p)


def test_policies_are_grouped_like_the_reference_and_each_fits_a_managed_policy():
    p = _params("us-gov-west-1", cluster="c" * 100)  # longest names and partition
    groups = karpenter_controller_policies(cluster_name=p["cluster"], region=p["region"], account=p["account"], node_role_arn=p["node_role_arn"], queue_arn=p["queue_arn"])
    assert tuple(groups) == CONTROLLER_POLICY_GROUPS
    for group, doc in groups.items():
        assert {s["Sid"] for s in doc["Statement"]} == {sid for sid, ref in REFERENCE.items() if ref["policy"] == group}
        chars = len("".join(json.dumps(doc).split()))  # IAM does not count whitespace
        assert chars <= MANAGED_POLICY_MAX_CHARS, f"{group}: {chars} characters"


@pytest.mark.parametrize("region", ["us-west-2", "cn-north-1"])
def test_no_mutating_action_on_every_resource_without_a_condition(region):
    for s in _ours(_params(region))["Statement"]:
        if "*" not in _as_set(s["Resource"]):
            continue
        mutating = [a for a in _as_set(s["Action"]) if not a.split(":", 1)[1].startswith(_READ_PREFIXES)]
        assert not mutating or s.get("Condition"), f"{s['Sid']} allows {mutating} on every resource without a condition"


def test_pricing_is_allowed_without_region_condition_in_us_west_2():
    """The Pricing API is served from us-east-1 (and two other regions): a region condition on
    our region would deny every pricing call from a us-west-2 cluster."""
    stmts = [s for s in _ours(_params("us-west-2"))["Statement"] if "pricing:GetProducts" in _as_set(s["Action"])]
    assert len(stmts) == 1
    assert stmts[0]["Resource"] == "*" and "Condition" not in stmts[0]
    region_conditioned = [s for s in _ours(_params("us-west-2"))["Statement"] if "aws:RequestedRegion" in json.dumps(s.get("Condition", {}))]
    assert all("pricing:GetProducts" not in _as_set(s["Action"]) for s in region_conditioned)


# Rendered plans (mock runtime).


def _controller_policies(run) -> dict[str, dict]:
    return {r.name.removeprefix("gpu-karpenter-controller-"): r for r in run.by_type("aws:iam/policy:Policy") if r.name.startswith("gpu-karpenter-controller-")}


@pytest.mark.parametrize("stack,region", [("dev", "us-west-2"), ("prod", "us-east-1")])
def test_rendered_controller_policies_match_the_reference(stack, region):
    run = run_stack(stack)
    cluster = run.one("eks:index:Cluster").inputs["name"]
    node_role = run.one("aws:iam/role:Role", "gpu-karpenter-node").state
    queue = run.one("aws:sqs/queue:Queue").state
    assert node_role["name"] == karpenter_node_role_name(cluster)
    p = {"partition": "aws", "region": region, "account": ACCOUNT, "cluster": cluster, "node_role_arn": node_role["arn"], "queue_arn": queue["arn"]}
    policies = _controller_policies(run)
    assert set(policies) == set(CONTROLLER_POLICY_GROUPS)
    merged = {"Statement": [s for g in CONTROLLER_POLICY_GROUPS for s in json.loads(policies[g].inputs["policy"])["Statement"]]}
    _assert_parity(merged, p)
    # us-west-2 (dev): pricing still unconditioned in what is deployed
    pricing = _by_sid(merged)["AllowPricingReadActions"]
    assert pricing["Resource"] == "*" and "Condition" not in pricing
    # every group is attached to the controller role, and Karpenter waits for the attachments
    controller = run.one("aws:iam/role:Role", "gpu-karpenter-controller")
    assert controller.inputs["name"] == karpenter_controller_role_name(cluster)
    attached = {a.inputs["policyArn"] for a in run.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if a.inputs["role"] == controller.inputs["name"]}
    assert attached == {pol.state["arn"] for pol in policies.values()}
    karpenter = next(r for r in run.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "karpenter")
    attachment_urns = {a.urn for a in run.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if a.name.startswith("gpu-karpenter-controller-")}
    assert attachment_urns and attachment_urns <= set(karpenter.depends_on)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_five_interruption_rules_each_targeting_the_queue(stack):
    run = run_stack(stack)
    queue = run.one("aws:sqs/queue:Queue").state
    rules = {r.state["name"]: json.loads(r.inputs["eventPattern"]) for r in run.by_type("aws:cloudwatch/eventRule:EventRule")}
    assert sorted(rules.values(), key=json.dumps) == sorted(REFERENCE_EVENT_PATTERNS, key=json.dumps)
    assert sorted(INTERRUPTION_EVENTS.values(), key=json.dumps) == sorted(REFERENCE_EVENT_PATTERNS, key=json.dumps)
    targets = run.by_type("aws:cloudwatch/eventTarget:EventTarget")
    assert {t.inputs["rule"] for t in targets} == set(rules)
    assert len(targets) == len(rules) == 5
    assert all(t.inputs["arn"] == queue["arn"] for t in targets)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_interruption_queue_settings_match_the_reference(stack):
    run = run_stack(stack)
    queue = run.one("aws:sqs/queue:Queue")
    assert queue.inputs["messageRetentionSeconds"] == 300
    assert queue.inputs["sqsManagedSseEnabled"] is True
    policy = json.loads(run.one("aws:sqs/queuePolicy:QueuePolicy").inputs["policy"])
    send = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    assert all(s["Action"] == "sqs:SendMessage" and s["Resource"] == queue.state["arn"] for s in send)
    # the reference's two senders; EventBridge scoped to the stack's rules (tests/test_encrypted_writers.py)
    assert sorted(s["Principal"]["Service"] for s in send) == ["events.amazonaws.com", "sqs.amazonaws.com"]
    deny = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny == [{"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": queue.state["arn"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]
