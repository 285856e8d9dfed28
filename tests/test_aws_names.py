"""Physical AWS names: they fit each service's limit, stay unique, and short ones never change."""

import re
from collections import defaultdict

import pytest

from config import names
from config.names import IAM_ROLE, NAME_RULES, SQS_QUEUE, TAG_VALUE, aws_name
from infra.gpu_aws import efa_placement_group_name, interruption_queue_name, karpenter_controller_role_name, karpenter_node_role_name
from tests.conftest import dev_config, run_config

LONGEST_CLUSTER = ("team-research-" + "x" * 100)[:100]  # as long as EKS (and _CLUSTER_NAME_RE) allow
EFA_ON = {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}
# Inputs that give a resource its physical name. Any AWS resource carrying one must have a rule in
# NAME_RULES, so a new explicitly named resource cannot slip past the length check.
NAME_KEYS = {"name", "nodeGroupName", "roleName", "queueName", "logGroupName", "ruleName", "policyName", "groupName"}
# IAM names are unique regardless of case (IAM API Reference, CreateRole).
CASE_INSENSITIVE = {"aws:iam/role:Role", "aws:iam/policy:Policy"}
# keys that name another resource, not this one (many metric filters read one log group)
REFERENCES = {("aws:cloudwatch/logMetricFilter:LogMetricFilter", "logGroupName")}


def test_short_names_are_the_plain_join():
    assert aws_name("training-dev", "karpenter-node", limit=64) == "training-dev-karpenter-node"
    exact = "c" * 49 + "-karpenter-node"
    assert len(exact) == 64 and aws_name("c" * 49, "karpenter-node", limit=64) == exact


def test_names_of_existing_stacks_do_not_change():
    for cluster in ("training-dev", "training-prod", "training-platform-dev"):
        assert karpenter_node_role_name(cluster) == f"{cluster}-karpenter-node"
        assert karpenter_controller_role_name(cluster) == f"{cluster}-karpenter-controller"
        assert interruption_queue_name(cluster) == f"{cluster}-karpenter"
        assert efa_placement_group_name(cluster) == f"{cluster}-efa"


def test_long_names_fit_keep_prefix_and_suffix_and_differ():
    node, controller = karpenter_node_role_name(LONGEST_CLUSTER), karpenter_controller_role_name(LONGEST_CLUSTER)
    assert node != controller
    for n, suffix in ((node, "-karpenter-node"), (controller, "-karpenter-controller")):
        assert len(n) <= 64 and IAM_ROLE.fits(n)
        assert n.startswith("team-research-x") and n.endswith(suffix)
        assert re.search(r"-[0-9a-f]{8}-karpenter-", n)
    queue = interruption_queue_name(LONGEST_CLUSTER)
    assert len(queue) <= 80 and SQS_QUEUE.fits(queue) and queue.endswith("-karpenter")
    # the old [:64] cut gave both roles one name
    assert f"{LONGEST_CLUSTER}-karpenter-node"[:64] == f"{LONGEST_CLUSTER}-karpenter-controller"[:64]


def test_deterministic_and_pinned():
    assert aws_name(LONGEST_CLUSTER, "karpenter-node", limit=64) == aws_name(LONGEST_CLUSTER, "karpenter-node", limit=64)
    # Pinned: a change of the scheme would rename (replace) the resources of long-named stacks.
    assert aws_name("x" * 100, "karpenter-node", limit=64) == "x" * 40 + "-7c4e1a7e-karpenter-node"


def test_unique_for_names_sharing_a_long_prefix():
    prefix = "p" * 90
    clusters = [f"{prefix}{i}" for i in range(1000)] + [f"{prefix}-{i}" for i in range(1000)]
    for suffix in ("karpenter-node", "karpenter-controller"):
        got = [aws_name(c, suffix, limit=64) for c in clusters]
        assert len(set(got)) == len(clusters)
    both = [aws_name(c, s, limit=64) for c in clusters for s in ("karpenter-node", "karpenter-controller")]
    assert len(set(both)) == len(both)


@pytest.mark.parametrize("rule", sorted(set(NAME_RULES.values()) | {TAG_VALUE}, key=lambda r: (r.limit, r.allowed)), ids=lambda r: f"{r.limit}")
def test_respects_every_limit_for_every_cluster_name_length(rule):
    for n in range(1, 101):
        cluster = ("a1-_" * 30)[:n].rstrip("-_") or "a"
        for suffix in ("karpenter-node", "karpenter-controller", "karpenter", "efa", "arm"):
            got = rule.name(cluster, suffix)
            assert rule.fits(got), (rule, got)


def test_characters_outside_the_charset_are_replaced_and_force_the_hash():
    a, b = aws_name("team.a", "q", limit=80), aws_name("team_a", "q", limit=80)
    assert a != b and SQS_QUEUE.fits(a) and a.startswith("team-a-")
    assert aws_name("team.a", "q", limit=80, allowed=r"[A-Za-z0-9._-]") == "team.a-q"


def test_suffix_longer_than_the_limit_still_fits():
    got = aws_name("a", "b" * 100, limit=20)
    assert len(got) <= 20 and re.fullmatch(r"a-b+-[0-9a-f]{8}", got)
    assert aws_name("a", "b" * 100, limit=20) != aws_name("a", "b" * 101, limit=20)


def test_other_separator_for_paths():
    assert names.LOG_GROUP.name("/vpc", "training-dev", "flow-logs", sep="/") == "/vpc/training-dev/flow-logs"


def test_rejects_unusable_arguments():
    with pytest.raises(ValueError):
        aws_name(limit=64)
    with pytest.raises(ValueError):
        aws_name("a", "", limit=64)
    with pytest.raises(ValueError):
        aws_name("a", limit=9)
    with pytest.raises(ValueError):
        aws_name("a", "b", limit=64, allowed=r"[a-z]")


def test_limits_table_has_sources():
    assert (IAM_ROLE.limit, names.IAM_POLICY.limit, SQS_QUEUE.limit, names.PLACEMENT_GROUP.limit) == (64, 128, 80, 255)
    assert (names.EKS_NODE_GROUP.limit, names.EVENT_RULE.limit, names.LOG_GROUP.limit, names.EKS_CLUSTER.limit) == (63, 64, 512, 100)
    assert all(rule.source for rule in NAME_RULES.values())


# Plan level: a 100-character cluster name, EFA on (placement group), everything rendered.


def _name_problems(run) -> list[tuple[str, str, str]]:
    """(type, input key, problem) for every explicit name in the plan that is unknown, too long,
    uses a forbidden character or repeats within its type."""
    problems = []
    seen: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for r in run.registrations:
        if not r.type.startswith(("aws:", "eks:index:")):
            continue
        for key in NAME_KEYS & set(r.inputs):
            value = r.inputs[key]
            if not isinstance(value, str):
                continue
            rule = NAME_RULES.get((r.type, key))
            if rule is None:
                problems.append((r.type, key, f"{r.name}: no name rule for this resource type; add one to config/names.NAME_RULES"))
                continue
            if not rule.fits(value):
                problems.append((r.type, key, f"{r.name}: {value!r} ({len(value)} characters) breaks the {rule.limit}-character limit or charset ({rule.source})"))
            if (r.type, key) not in REFERENCES:
                seen[(r.type, key)][value.lower() if r.type in CASE_INSENSITIVE else value].append(r.name)
        name_tag = (r.inputs.get("tags") or {}).get("Name")
        if isinstance(name_tag, str) and not TAG_VALUE.fits(name_tag):
            problems.append((r.type, "tags.Name", f"{r.name}: Name tag {len(name_tag)} characters"))
    for (typ, key), values in seen.items():
        for value, owners in values.items():
            if len(owners) > 1:
                problems.append((typ, key, f"{owners} share the name {value!r}"))
    return problems


# Node group names come from infra/cluster.py; checked on their own below.
LEAD_OWNED = {("eks:index:ManagedNodeGroup", "nodeGroupName")}


@pytest.fixture(scope="module")
def longest_run():
    run = run_config(dev_config(cluster={"name": LONGEST_CLUSTER}, efa=EFA_ON))
    assert run.one("eks:index:Cluster").inputs["name"] == LONGEST_CLUSTER
    return run


def test_plan_with_longest_cluster_name_names_fit_and_are_unique(longest_run):
    problems = [p for p in _name_problems(longest_run) if p[:2] not in LEAD_OWNED]
    assert problems == []
    named = {(r.type, r.name) for r in longest_run.registrations if isinstance(r.inputs.get("name"), str)}
    for expected in (("aws:iam/role:Role", "gpu-karpenter-node"), ("aws:iam/role:Role", "gpu-karpenter-controller"), ("aws:sqs/queue:Queue", "gpu-interruptions"), ("aws:ec2/placementGroup:PlacementGroup", "gpu-efa")):
        assert expected in named  # the check saw the names of infra/gpu_aws.py


def test_plan_with_longest_cluster_name_node_group_names_are_unique(longest_run):
    assert [p for p in _name_problems(longest_run) if p[:2] in LEAD_OWNED] == []


def test_name_check_notices_a_collision():
    class Fake:
        def __init__(self, name, value):
            self.type, self.name, self.inputs = "aws:iam/role:Role", name, {"name": value}

    class FakeRun:
        registrations = [Fake("a", "Same-Role"), Fake("b", "same-role"), Fake("c", "r" * 65)]

    problems = [p[2] for p in _name_problems(FakeRun())]
    assert any("share the name" in p for p in problems) and any("65 characters" in p for p in problems)


# Every name for every cluster name the config accepts (config/checks.py _CLUSTER_NAME_RE: a letter or
# digit, then letters, digits, '-' and '_'), the portal on so that its repository and ALB are named too.
ACCEPTED_CLUSTERS = ["a--b", "x_", "trailing-", "Train", "train", "internal-lb", "9_-_9", LONGEST_CLUSTER]


@pytest.fixture(scope="module")
def accepted_runs():
    import copy

    from tests.conftest import stack_file
    from tests.e2e.portal_helpers import PORTAL

    runs = {}
    for cluster in ACCEPTED_CLUSTERS:
        cfg = copy.deepcopy(stack_file("teams")["config"])
        cfg["training-platform:cluster"] = {**cfg.get("training-platform:cluster", {}), "name": cluster}
        cfg["training-platform:portal"] = copy.deepcopy(PORTAL)
        runs[cluster] = run_config(cfg, stack="teams")
    return runs


@pytest.mark.parametrize("cluster", ACCEPTED_CLUSTERS)
def test_every_aws_name_is_valid_for_its_service_for_every_accepted_cluster_name(accepted_runs, cluster):
    from k8s.builders.portal import load_balancer_name

    run = accepted_runs[cluster]
    assert run.one("eks:index:Cluster").inputs["name"] == cluster
    assert [p for p in _name_problems(run) if p[:2] not in LEAD_OWNED] == []
    repositories = [r.inputs["name"] for r in run.by_type("aws:ecr/repository:Repository")]
    assert len(repositories) >= 2 and all(names.ECR_REPOSITORY.fits(r) for r in repositories), repositories  # workloads and portal/
    assert names.LOAD_BALANCER.fits(load_balancer_name(cluster))
    ingresses = [r for r in run.registrations if r.type.endswith(":Ingress")]
    lb = {i.inputs["metadata"]["annotations"].get("alb.ingress.kubernetes.io/load-balancer-name") for i in ingresses} - {None}
    assert lb == {load_balancer_name(cluster)}


def test_names_that_differ_in_case_or_separators_stay_apart(accepted_runs):
    def repos(cluster):
        return {r.name: r.inputs["name"] for r in accepted_runs[cluster].by_type("aws:ecr/repository:Repository")}

    assert set(repos("Train").values()).isdisjoint(repos("train").values())


def test_the_pattern_rules_refuse_what_the_services_refuse():
    assert not names.ECR_REPOSITORY.fits("a--b/portal") and not names.ECR_REPOSITORY.fits("x_/portal") and not names.ECR_REPOSITORY.fits("Train/portal")
    assert not names.ECR_REPOSITORY.fits("a") and names.ECR_REPOSITORY.fits("a-b/c.d_e")
    assert not names.LOAD_BALANCER.fits("internal-x-portal") and not names.LOAD_BALANCER.fits("x-") and not names.LOAD_BALANCER.fits("-x")
    assert names.ECR_REPOSITORY.name("a--b", "portal", sep="/") != names.ECR_REPOSITORY.name("a-b", "portal", sep="/")
    assert names.LOAD_BALANCER.name("internal-lb", "portal").endswith("-portal") and names.LOAD_BALANCER.fits(names.LOAD_BALANCER.name("internal-lb", "portal"))
