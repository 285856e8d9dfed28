"""Every AWS resource that another one's create (or delete) checks waits for it in the plan.

Pulumi creates resources in parallel unless one depends on another (an input it takes from it,
or ``depends_on``). Where AWS checks, at create time, something that a separate resource sets
up, the first must wait for the second or the first ``pulumi up`` races and fails. The table
says, per resource type, which related resources it must wait for, how they are related, and
the AWS source; the test finds each related pair in rendered plans of several variants and
asserts the waiter depends on (``dependsOn``: explicit and input dependencies) the awaited.

Checked and not in the table, because AWS checks nothing the stack creates separately at that
point (each decision's source):
* EFS mount targets and their groups' rules: CreateMountTarget checks the groups exist
  (SecurityGroupNotFound) and their number, not their rules (EFS API Reference, CreateMountTarget,
  Errors; the same list in aws-sdk-efs CreateMountTargetError). The groups are inputs.
* VPC flow logs and their role's policy: the permissions are used when logs are delivered
  (Amazon VPC User Guide, "IAM role for publishing flow logs to CloudWatch Logs").
* EventBridge targets and the queue policy, SNS subscriptions, CloudWatch alarm actions:
  PutTargets, Subscribe and PutMetricAlarm check no resource policy; delivery does. The targets
  and alarms wait anyway (tests/test_encrypted_writers.py), so nothing is sent before it is allowed.
* KMS keys: the key policy is set in CreateKey (``aws.kms.Key(policy=...)``), so whatever
  encrypts with a key (and so references it) finds its policy in place.
* Pod identity associations and access entries name a role by its ARN, an input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.conftest import dev_config, run_config, run_stack
from tools.mock_runtime import ProgramRun, Registration


@dataclass(frozen=True)
class MustWait:
    waiter: str  # Pulumi type token of the resource whose create checks
    awaited: str  # type token of what it checks
    related: Callable[[Registration, Registration, ProgramRun], bool]  # is this awaited one the waiter's?
    source: str


def _rule_of_group(fs: Registration, rule: Registration, _run: ProgramRun) -> bool:
    return rule.inputs.get("securityGroupId") in fs.inputs.get("securityGroupIds", [])


def _policy_of_node_role(group: Registration, attachment: Registration, run: ProgramRun) -> bool:
    role_urn = (group.inputs.get("nodeRole") or {}).get("urn")
    return any(r.urn == role_urn and attachment.inputs.get("role") == r.state.get("name") for r in run.registrations)


def _entry_of_association(assoc: Registration, entry: Registration, _run: ProgramRun) -> bool:
    return (entry.inputs.get("principalArn"), entry.inputs.get("clusterName")) == (assoc.inputs.get("principalArn"), assoc.inputs.get("clusterName"))


TABLE = [
    MustWait(
        "aws:fsx/lustreFileSystem:LustreFileSystem", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", _rule_of_group,
        "FSx CreateFileSystem refuses groups without LNET rules (988, 1018-1023): InvalidNetworkSettings "
        "'... do not permit Lustre LNET network traffic on port 988' (aws/aws-parallelcluster#6181, the race; fix #1198)",
    ),
    MustWait("aws:fsx/lustreFileSystem:LustreFileSystem", "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", _rule_of_group, "as above, the groups' egress"),
    MustWait(
        "eks:index:ManagedNodeGroup", "aws:iam/rolePolicyAttachment:RolePolicyAttachment", _policy_of_node_role,
        "EKS User Guide 'Amazon EKS node IAM role': nodes need the role's policies to register (else NodeCreationFailure); "
        "terraform-provider-aws website/docs/r/eks_node_group: permissions created before and deleted after the node group",
    ),
    MustWait(
        "aws:eks/accessPolicyAssociation:AccessPolicyAssociation", "aws:eks/accessEntry:AccessEntry", _entry_of_association,
        "EKS API Reference AssociateAccessPolicy: associates a policy with an existing access entry (ResourceNotFoundException otherwise)",
    ),
]

EFS = {"checkpointStorage": {"type": "efs"}}
TEAM = {"vision": {"gpuQuota": 8, "principalArns": ["arn:aws:iam::123456789012:role/vision"], "namespaceViewPolicy": True}}


def _variants() -> dict[str, ProgramRun]:
    return {
        "dev": run_stack("dev"),
        "prod": run_stack("prod"),
        "teams": run_stack("teams"),
        "dev-efs": run_config(dev_config(trainjobs=EFS)),
        "dev-team-access": run_config(dev_config(tenants=TEAM)),
    }


def _pairs(run: ProgramRun, rule: MustWait) -> list[tuple[Registration, Registration]]:
    return [(w, a) for w in run.by_type(rule.waiter) for a in run.by_type(rule.awaited) if rule.related(w, a, run)]


@pytest.mark.parametrize("rule", TABLE, ids=lambda r: f"{r.waiter.split(':')[-1]}<-{r.awaited.split(':')[-1]}")
def test_each_resource_waits_for_what_its_create_checks(rule):
    found = 0
    for variant, run in _variants().items():
        for waiter, awaited in _pairs(run, rule):
            found += 1
            assert awaited.urn in waiter.depends_on, f"{variant}: {waiter.name} ({rule.waiter}) does not wait for {awaited.name}: {rule.source}"
    assert found, f"no {rule.waiter} with a related {rule.awaited} in any variant: the table row is not exercised"


def test_fsx_waits_for_each_lnet_rule_of_its_group():
    """The row above, spelled out for the default storage: both LNET port ranges, both directions."""
    run = run_stack("dev")
    fs = run.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    rules = [r for t in ("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule") for r in run.by_type(t)]
    own = [r for r in rules if r.inputs["securityGroupId"] in fs.inputs["securityGroupIds"]]
    assert {(r.inputs["fromPort"], r.inputs["toPort"]) for r in own} == {(988, 988), (1018, 1023)}
    assert {r.type.split(":")[-1] for r in own} == {"SecurityGroupIngressRule", "SecurityGroupEgressRule"}
    assert all(r.urn in fs.depends_on for r in own)


def test_the_table_fails_a_plan_that_races():
    """The check can fail: a file system registered without the explicit dependency (what the
    plan held before) is caught."""
    run = run_stack("dev")
    fs = run.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    raced = Registration(**{**fs.__dict__, "depends_on": [d for d in fs.depends_on if "SecurityGroupIngressRule" not in d and "SecurityGroupEgressRule" not in d]})
    rule = TABLE[0]
    awaited = [a for a in run.by_type(rule.awaited) if rule.related(raced, a, run)]
    assert awaited and not all(a.urn in raced.depends_on for a in awaited)


def test_plan_entries_carry_the_dependencies():
    """plan.json (what reviewers read) holds the same dependencies the test checks."""
    run = run_stack("dev")
    plan = {r["urn"]: r for r in json.loads(json.dumps(run.plan()))["resources"]}
    fs = run.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert plan[fs.urn]["dependsOn"] == fs.depends_on
