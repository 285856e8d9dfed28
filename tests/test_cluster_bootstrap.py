"""What the first `pulumi up` of a cluster needs beyond valid inputs: CoreDNS only once nodes
exist, the Karpenter discovery tag on exactly one security group, and no duplicate access entry
for the principal that creates the cluster.

Facts from pulumi-eks ``nodejs/eks/cluster/cluster.ts`` (v4.3.0): the cluster is created with
``bootstrapClusterCreatorAdminPermissions: true``; ``tags`` go onto every security group the
component creates (cluster security group, node security group); the CoreDNS add-on is created
inside the component whenever Auto Mode is on or it is explicitly enabled, with no dependency on
any node group (pulumi-eks #1819).
"""

from __future__ import annotations

import json

import pytest

from infra.cluster import admin_access_entries, iam_principal_of
from tests.conftest import PROJECT, dev_config, run_config, run_stack, stack_file
from tools.mock_runtime import run_program


def _cluster_inputs(run) -> dict:
    return run.one("eks:index:Cluster").inputs


def _admin_entries(run) -> dict:
    """The adminPrincipalArns entries (the CI roles' are tests/test_ci_access.py's)."""
    return {k: v for k, v in _cluster_inputs(run)["accessEntries"].items() if k.startswith("admin-")}


def test_coredns_addon_is_created_after_the_node_groups_not_inside_the_cluster():
    run = run_stack("dev")
    assert _cluster_inputs(run)["corednsAddonOptions"]["enabled"] is False
    addon = [r for r in run.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "coredns"]
    assert len(addon) == 1
    node_groups = [r.urn for r in run.by_type("eks:index:ManagedNodeGroup")]
    assert len(node_groups) == 2 and set(node_groups) <= set(addon[0].depends_on)
    assert addon[0].inputs["addonVersion"] == "v1.12.4-eksbuild.1"  # EKS's table for 1.34
    # Kubernetes objects (and the Helm releases) wait for DNS through the provider
    provider = run.one("pulumi:providers:kubernetes")
    assert addon[0].urn in provider.depends_on


@pytest.mark.parametrize("version, expected", [("1.32", "v1.11.4-eksbuild.24"), ("1.33", "v1.12.4-eksbuild.1")])
def test_coredns_version_follows_the_cluster_version(version, expected):
    run = run_config(dev_config(cluster={"version": version}))
    addon = [r for r in run.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "coredns"][0]
    assert addon.inputs["addonVersion"] == expected


def test_auto_mode_gets_coredns_for_its_managed_node_groups_only():
    """Auto Mode's DNS serves its own nodes; pods on the managed node groups need CoreDNS, kept off
    Auto Mode's nodes; a karpenter-mode stack's CoreDNS keeps the add-on's default placement."""
    from infra.cluster import coredns_configuration
    from k8s.builders.scheduling import affinity_misses

    run = run_config(dev_config(gpuPool={"mode": "auto"}))
    assert _cluster_inputs(run)["corednsAddonOptions"]["enabled"] is False
    addon = [r for r in run.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "coredns"]
    assert len(addon) == 1 and set(r.urn for r in run.by_type("eks:index:ManagedNodeGroup")) <= set(addon[0].depends_on)
    affinity = json.loads(addon[0].inputs["configurationValues"])["affinity"]
    assert affinity == coredns_configuration(True)["affinity"]
    node_group = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64", "eks.amazonaws.com/nodegroup": "arm"}
    auto_node = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "eks.amazonaws.com/compute-type": "auto"}
    assert affinity_misses(affinity, node_group) is None and affinity_misses(affinity, auto_node)
    karpenter = [r for r in run_stack("dev").by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "coredns"][0]
    assert not karpenter.inputs.get("configurationValues")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_discovery_tag_is_on_exactly_one_security_group(stack):
    run = run_stack(stack)
    cluster = _cluster_inputs(run)
    for key in ("tags", "clusterSecurityGroupTags", "nodeSecurityGroupTags"):
        assert "karpenter.sh/discovery" not in (cluster.get(key) or {}), key
    for sg in run.by_type("aws:ec2/securityGroup:SecurityGroup"):
        assert "karpenter.sh/discovery" not in (sg.inputs.get("tags") or {}), sg.name
    tags = [r for r in run.by_type("aws:ec2/tag:Tag") if r.inputs["key"] == "karpenter.sh/discovery"]
    assert len(tags) == 1  # the EKS-managed cluster security group, which managed nodes use too
    subnets = [r for r in run.by_type("aws:ec2/subnet:Subnet") if "karpenter.sh/discovery" in (r.inputs.get("tags") or {})]
    assert subnets and all(r.inputs["tags"].get("kubernetes.io/role/internal-elb") == "1" for r in subnets)


def test_iam_principal_of_assumed_role_session():
    assert iam_principal_of("arn:aws:sts::210987654321:assumed-role/ci-deployer/gh-run-42") == "arn:aws:iam::210987654321:role/ci-deployer"
    assert iam_principal_of("arn:aws:iam::210987654321:user/alice") == "arn:aws:iam::210987654321:user/alice"
    assert iam_principal_of("arn:aws-us-gov:sts::210987654321:assumed-role/r/s") == "arn:aws-us-gov:iam::210987654321:role/r"


def test_creator_is_left_out_of_explicit_admin_entries_by_role_name_and_account():
    admins = ["arn:aws:iam::210987654321:role/PlatformAdmin", "arn:aws:iam::210987654321:role/team/ci-deployer"]
    entries = admin_access_entries(admins, creator_arn="arn:aws:iam::210987654321:role/ci-deployer")
    assert list(entries) == ["admin-0"]  # keys keep their list position
    assert admin_access_entries(admins, creator_arn="arn:aws:iam::999999999999:role/ci-deployer").keys() == {"admin-0", "admin-1"}
    assert admin_access_entries(admins, creator_arn=None).keys() == {"admin-0", "admin-1"}


def test_prod_deployed_by_a_listed_role_gets_no_second_entry():
    config = stack_file("prod")
    run = run_program(str(PROJECT), "prod", stack_config=config, caller_arn="arn:aws:sts::210987654321:assumed-role/ci-deployer/pulumi-up")
    entries = _admin_entries(run)
    principals = [e["principalArn"] for e in entries.values()]
    assert principals == ["arn:aws:iam::210987654321:role/PlatformAdmin"]
    assert set(entries) == {"admin-0"}
    param = run.one("aws:ssm/parameter:Parameter", "eks-bootstrap-admin")
    assert param.inputs["name"] == "/training-platform/training-prod/bootstrap-admin"
    # the recorded creator never changes after creation, whoever runs later updates
    assert "value" in param.ignore_changes


def test_unlisted_deployer_keeps_every_listed_admin():
    run = run_program(str(PROJECT), "prod", stack_config=stack_file("prod"), caller_arn="arn:aws:sts::210987654321:assumed-role/someone-else/s")
    assert len(_admin_entries(run)) == 2


def test_later_run_by_another_admin_keeps_its_own_entry():
    """The creator recorded by the first deploy wins over whoever runs the update."""
    recorded = {"/training-platform/training-prod/bootstrap-admin": "arn:aws:iam::210987654321:role/ci-deployer"}
    run = run_program(
        str(PROJECT), "prod", stack_config=stack_file("prod"), caller_arn="arn:aws:sts::210987654321:assumed-role/PlatformAdmin/alice", ssm_parameters=recorded
    )
    principals = [e["principalArn"] for e in _admin_entries(run).values()]
    assert principals == ["arn:aws:iam::210987654321:role/PlatformAdmin"]



def test_access_entries_reach_pulumi_eks_as_a_plain_map(monkeypatch):
    """accessEntries is a plain input of the pulumi-eks component (its provider iterates the
    object it receives): an Output there would be walked as an object, not as entries."""
    import pulumi
    import pulumi_eks

    import infra.cluster
    seen = []
    original = pulumi_eks.Cluster

    def recording(*args, **kwargs):
        seen.append(kwargs.get("access_entries"))
        return original(*args, **kwargs)

    monkeypatch.setattr(infra.cluster.eks, "Cluster", recording)
    run_program(str(PROJECT), "prod", stack_config=stack_file("prod"), caller_arn="arn:aws:sts::210987654321:assumed-role/ci-deployer/s")
    assert len(seen) == 1 and isinstance(seen[0], dict) and not isinstance(seen[0], pulumi.Output)
    assert all(isinstance(v, pulumi_eks.AccessEntryArgs) for v in seen[0].values())
