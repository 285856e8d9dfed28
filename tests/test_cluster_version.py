"""A ``cluster.version`` bump upgrades the control plane, then the managed node groups (whose version
is the cluster's), then the add-ons; GPU nodes follow through Karpenter's AMI alias.

Facts: pulumi-eks v4.3.0 ``nodejs/eks/nodes/nodegroup.ts`` (createManagedNodeGroup) sets a managed
node group's version to the cluster's only ``if (!args.version && !args.launchTemplate)``; our groups
have a launch template, so the version must be given. Kubernetes version skew policy: a kubelet must
not be newer than kube-apiserver (node groups after the control plane). karpenter-provider-aws v1.14.1
``pkg/providers/amifamily/al2023.go``: an ``al2023@<release>`` alias resolves per the cluster's
Kubernetes version (no version in the alias).
"""

from __future__ import annotations

import re

import pytest

import versions
from tests.conftest import dev_config, find, run_config, run_stack, stack_file
from tests.test_destroy_order import Graph

NEXT = {"1.32": "1.33", "1.33": "1.34", "1.34": "1.35"}


def _runs():
    bumped = NEXT[stack_file("dev")["config"]["training-platform:cluster"]["version"]]
    return {"dev": run_stack("dev"), "prod": run_stack("prod"), f"dev@{bumped}": run_config(dev_config(cluster={"version": bumped}))}


@pytest.fixture(scope="module")
def runs():
    return _runs()


def _cluster_version(run) -> str:
    return run.one("eks:index:Cluster").inputs["version"]


def test_every_node_group_has_a_launch_template_and_the_clusters_version(runs):
    for label, run in runs.items():
        groups = run.by_type("eks:index:ManagedNodeGroup")
        assert len(groups) == 2, label
        for ng in groups:
            # with a launch template pulumi-eks leaves version unset: it has to be ours
            assert ng.inputs.get("launchTemplate"), (label, ng.name)
            assert ng.inputs.get("version") == _cluster_version(run), (label, ng.name, ng.inputs.get("version"))
    assert _cluster_version(runs["dev"]) != _cluster_version([r for k, r in runs.items() if "@" in k][0])


def test_node_groups_wait_for_the_control_plane(runs):
    for label, run in runs.items():
        cluster = run.one("eks:index:Cluster").urn
        for ng in run.by_type("eks:index:ManagedNodeGroup"):
            assert cluster in ng.depends_on, (label, ng.name)


def test_every_addon_waits_for_every_node_group(runs):
    for label, run in runs.items():
        graph = Graph(run.plan())
        groups = graph.find("eks:index:ManagedNodeGroup")
        addons = graph.find("aws:eks/addon:Addon")
        names = {a.rsplit("::", 1)[-1] for a in addons}
        # CoreDNS, Pod Identity, the CSI driver, node monitoring, CloudWatch
        assert {"eks-coredns", "gpu-pod-identity-agent", "checkpoints-csi", "node-health-node-monitoring-agent", "observability-cloudwatch-addon"} <= names, (label, names)
        graph.all_reach(addons, groups)
        for g in groups:  # and nothing the other way round
            assert not any(graph.reaches(g, a) for a in addons), (label, g)


def test_coredns_follows_the_bumped_version(runs):
    for label, run in runs.items():
        coredns = [r for r in run.by_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "coredns"]
        assert len(coredns) == 1
        assert coredns[0].inputs["addonVersion"] == versions.COREDNS_ADDON_VERSIONS[_cluster_version(run)], label


def test_gpu_node_alias_names_an_ami_release_not_a_kubernetes_version(runs):
    # Karpenter builds the SSM path from the version it reads from the cluster and this release date
    assert re.fullmatch(r"al2023@v\d{8}", versions.GPU_NODE_AMI_ALIAS)
    for label, run in runs.items():
        node_class = find(run, "EC2NodeClass", "gpu")
        assert node_class["spec"]["amiSelectorTerms"] == [{"alias": versions.GPU_NODE_AMI_ALIAS}], label
