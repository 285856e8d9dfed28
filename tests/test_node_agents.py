"""Every node agent the platform relies on runs on every node it must watch: the node kinds each
shipped stack's plan makes (managed node groups, every instance type of every NodePool, fenced GPU
nodes), the agents it installs with the values it sets merged over the charts' defaults
(config/node_agents.yaml, each fact with its source), and Kubernetes' toleration, nodeSelector and
node-affinity rules between them."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

import versions
from config import node_agents as table
from k8s.builders import gpu_objects as g
from k8s.builders import node_agents as na
from k8s.builders import scheduling as s
from k8s.pods.preflight_fence import TAINT as FENCE_TAINT
from tests.conftest import dev_config, run_config, run_stack
from tools import node_agents as tna

STACKS = ["dev", "prod", "teams", "workshop"]
ADDON = "aws:eks/addon:Addon"
RELEASE = "kubernetes:helm.sh/v3:Release"
# Add-ons and charts the platform installs that run no DaemonSet (so they are not in the table)
NOT_NODE_AGENTS = {
    "coredns": "a Deployment",
    versions.KARPENTER_CHART: "a Deployment on the system nodes",
    versions.TRAINER_CHART: "Deployments (controller, JobSet)",
    versions.KUEUE_CHART: "a Deployment",
}


def _unexplained(findings: list[na.Finding]) -> list[str]:
    return [str(f) for f in findings if f.accepted is None]


# --- shipped stacks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_agent_runs_on_every_node_kind_it_must(stack):
    run = run_stack(stack)
    kinds = tna.node_kinds(run)
    assert {k.arch for k in kinds if "system" in k.tags} == {"arm64", "amd64"}
    assert any("gpu" in k.tags for k in kinds) and any("fenced-gpu" in k.tags for k in kinds)
    found = tna.findings(run)
    assert _unexplained(found) == []
    # the one known gap: CloudWatch's DCGM exporter on instance types its chart does not list
    for f in found:
        assert (f.agent, f.daemon_set) == ("amazon-cloudwatch-observability", "dcgm-exporter") and "p5.4xlarge" in f.node_kind, str(f)


@pytest.mark.parametrize("stack", STACKS)
def test_every_daemonset_addon_and_chart_of_a_stack_is_in_the_table(stack):
    run = run_stack(stack)
    agents = table.agents()
    known = {a.installed_as.addon or a.installed_as.chart for a in agents.values()}
    installed = {r.inputs["addonName"] for r in run.by_type(ADDON)} | {r.inputs["chart"] for r in run.by_type(RELEASE)}
    assert installed - known - set(NOT_NODE_AGENTS) == set()
    present = tna.installed(run, agents)
    assert present["vpc-cni"] == {} and present["kube-proxy"] == {}  # pulumi-eks makes both outside Auto Mode


def test_the_node_kinds_of_a_stack_carry_its_labels_taints_and_architecture():
    dev = {k.name: k for k in tna.node_kinds(run_stack("dev"))}
    arm = dev["node group training-dev-arm (c7g.2xlarge)"]
    assert arm.arch == "arm64" and arm.labels["training-platform/node-role"] == "system" and arm.taints == ()
    gpu = dev["NodePool gpu-pool (g5.xlarge, amd64)"]
    assert gpu.tags == {"gpu"} and gpu.labels[g.POOL_LABEL] == "gpu-pool" and gpu.labels[s.INSTANCE_TYPE] == "g5.xlarge"
    assert [dict(t) for t in gpu.taints] == [g.GPU_TAINT]
    fenced = dev["NodePool gpu-pool (g5.xlarge, amd64), fenced"]
    assert fenced.tags == {"fenced-gpu"} and FENCE_TAINT in [dict(t) for t in fenced.taints]
    prod = [k for k in tna.node_kinds(run_stack("prod")) if "efa-gpu" in k.tags]
    assert {k.labels[s.INSTANCE_TYPE] for k in prod} == {"p5.48xlarge", "p5en.48xlarge"}
    assert all(k.labels[g.EFA_LABEL] == "true" and k.labels["topology.kubernetes.io/zone"] == "us-east-1a" for k in prod)


# --- the node monitoring agent (issue: its DCGM server never ran on the GPU nodes) ---------------------


def test_todays_node_monitoring_agent_default_keeps_its_dcgm_server_off_every_gpu_node():
    run = run_stack("dev")
    plan = tna.plan_of(run)
    assert na.check(table.agents(), plan) == [f for f in na.check(table.agents(), plan) if f.accepted]
    plan.installed["eks-node-monitoring-agent"] = {}  # the add-on as it was: no configuration values
    found = [f for f in na.check(table.agents(), plan) if f.agent == "eks-node-monitoring-agent"]
    gpu_kinds = {k.name for k in plan.kinds if k.tags & {"gpu", "fenced-gpu"}}
    assert {f.node_kind for f in found} == gpu_kinds and {f.daemon_set for f in found} == {"dcgm-server"}
    assert all(f.accepted is None and f.problems[0].text.startswith("does not tolerate taint nvidia.com/gpu=:NoSchedule") for f in found)


def test_the_node_monitoring_agent_configuration_is_what_the_plan_sends_and_its_schema_accepts():
    addon = next(r for r in run_stack("dev").by_type(ADDON) if r.inputs["addonName"] == "eks-node-monitoring-agent")
    config = json.loads(addon.inputs["configurationValues"])
    assert config == na.node_monitoring_agent_configuration()
    for section, values in config.items():
        assert set(values) <= na.NODE_MONITORING_AGENT_SCHEMA[section], section
    assert s.untolerated(config["dcgmAgent"]["tolerations"], [g.GPU_TAINT, FENCE_TAINT]) == []


# --- the class: each default that does not fit is caught ------------------------------------------------


@pytest.mark.parametrize(
    ("config", "agent", "cut", "expect"),
    [
        ({}, "nvidia-device-plugin", {}, "affinity"),  # the chart's affinity wants NFD or gpu.present labels
        ({}, "amazon-cloudwatch-observability", {"tolerations": []}, "taint"),
        ({"efa": {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["g5.12xlarge"]}}, "aws-efa-k8s-device-plugin", {}, "taint"),
        ({"observability": {"mode": "prometheus"}}, "dcgm-exporter", {}, "taint"),
        ({"observability": {"mode": "prometheus"}}, "kube-prometheus-stack", {"prometheus-node-exporter": {"tolerations": [{"key": "x", "operator": "Exists"}]}}, "taint"),
    ],
)
def test_a_default_or_a_narrower_value_that_keeps_an_agent_off_our_nodes_is_found(config, agent, cut, expect):
    plan = tna.plan_of(run_config(dev_config(**config)))
    assert _unexplained(na.check(table.agents(), plan)) == []
    plan.installed[agent] = cut
    found = [f for f in na.check(table.agents(), plan) if f.agent == agent and f.accepted is None]
    causes = [{p.cause for p in f.problems} for f in found]
    assert any(expect in c for c in causes) and all(c & {expect, "must-not-run"} for c in causes), [str(f) for f in found]


def test_an_agent_only_for_gpu_nodes_that_would_land_on_the_system_nodes_is_found():
    plan = tna.plan_of(run_config(dev_config(observability={"mode": "prometheus"})))
    plan.installed["dcgm-exporter"] = {"tolerations": [na.TOLERATE_ALL]}  # the chart's affinity {} lets it anywhere
    found = [f for f in na.check(table.agents(), plan) if f.agent == "dcgm-exporter"]
    assert {f.node_kind for f in found} == {k.name for k in plan.kinds if "system" in k.tags}
    assert all(f.problems[0].cause == "must-not-run" for f in found)


def test_a_required_agent_that_is_missing_is_found():
    plan = tna.plan_of(run_stack("dev"))
    plan.installed["eks-pod-identity-agent"] = None
    found = [f for f in na.check(table.agents(), plan) if f.agent == "eks-pod-identity-agent"]
    assert found and all(f.problems[0].cause == "not-installed" for f in found)


def test_an_image_without_the_nodes_architecture_is_found():
    agents = dict(table.agents())
    fsx = agents["aws-fsx-csi-driver"]
    node = fsx.daemon_sets["fsx-csi-node"]
    assert node.architectures is not None
    amd64_only = node.model_copy(update={"architectures": node.architectures.model_copy(update={"values": ("amd64",)})})
    agents["aws-fsx-csi-driver"] = fsx.model_copy(update={"daemon_sets": {"fsx-csi-node": amd64_only}})
    found = na.check(agents, tna.plan_of(run_stack("dev"), agents))
    assert {f.node_kind for f in found if f.agent == "aws-fsx-csi-driver"} == {"node group training-dev-arm (c7g.2xlarge)"}


def test_other_variants_run_every_agent_where_it_must():
    for config in (dev_config(observability={"mode": "prometheus"}), dev_config(gpuPool={"instanceFamilies": ["g5", "p5"], "instanceCategories": []}), dev_config(trainjobs={"checkpointStorage": {"type": "efs"}})):
        assert _unexplained(tna.findings(run_config(config))) == []


# --- EKS Auto Mode ---------------------------------------------------------------------------------


def test_auto_mode_installs_no_agent_auto_mode_brings_itself_and_runs_cloudwatch_on_its_gpu_nodes():
    run = run_config(dev_config(gpuPool={"mode": "auto"}))
    plan = tna.plan_of(run)
    for agent in ("eks-node-monitoring-agent", "nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        assert plan.installed[agent] is None, agent  # Auto Mode's own node monitoring and GPU plugins
    auto = [k for k in plan.kinds if "auto-gpu" in k.tags]
    assert auto and all(k.labels[na.COMPUTE_TYPE] == "auto" for k in auto)
    found = na.check(table.agents(), plan)
    assert not [f for f in found if f.node_kind in {k.name for k in auto} and f.accepted is None]
    # the managed node groups, which Auto Mode does not network, get the vpc-cni and kube-proxy add-ons
    assert plan.installed["vpc-cni"] == {} and plan.installed["kube-proxy"] == {}
    assert not [f for f in found if f.agent in ("vpc-cni", "kube-proxy")]
    assert plan.installed["eks-pod-identity-agent"] == {}  # Auto Mode runs it on its own nodes only
    assert _unexplained(found) == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_agents_we_install_run_at_the_versions_the_table_was_read_at(stack):
    run = run_stack(stack)
    addons = {r.inputs["addonName"]: r.inputs.get("addonVersion") for r in run.by_type(ADDON)}
    charts = {r.inputs["chart"]: r.inputs.get("version") for r in run.by_type(RELEASE)}
    for name, agent in table.agents().items():
        how, pin = agent.installed_as, agent.version.pin
        if pin is None or (how.addon or how.chart) not in {**addons, **charts}:
            continue
        assert (addons.get(how.addon) if how.addon else charts.get(how.chart)) == getattr(versions, pin), name


# --- the matching rules ---------------------------------------------------------------------------------


def test_tolerations_follow_kubernetes_rules():
    gpu = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    assert s.tolerates({"operator": "Exists"}, gpu)
    assert s.tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, gpu)
    assert not s.tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, gpu)
    assert not s.tolerates({"key": "nvidia.com/gpu", "value": "true"}, gpu)  # Equal compares the empty value
    assert s.tolerates({"key": "training-platform/preflight-failed", "value": "true", "effect": "NoSchedule"}, FENCE_TAINT)
    assert not s.tolerates({"effect": "NoSchedule"}, gpu)  # an empty key needs Exists
    assert s.untolerated([], [{"key": "k", "effect": "PreferNoSchedule"}]) == []  # a preference keeps nothing off


def test_node_affinity_follows_kubernetes_rules():
    labels = {"kubernetes.io/arch": "amd64", "n": "5"}

    def req(*terms):
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}

    def term(*exprs):
        return {"matchExpressions": list(exprs)}

    assert s.affinity_misses(None, labels) is None and s.affinity_misses({}, labels) is None
    assert s.affinity_misses(req(term({"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}), term({"key": "x", "operator": "DoesNotExist"})), labels) is None  # terms ORed
    missed = s.affinity_misses(req(term({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}, {"key": "x", "operator": "Exists"})), labels)
    assert missed == [[{"key": "x", "operator": "Exists"}]]  # expressions ANDed
    assert s.affinity_misses(req(term({"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]})), labels) is None  # NotIn: absent label holds
    assert s.affinity_misses(req(term({"key": "n", "operator": "Gt", "values": ["4"]})), labels) is None
    assert s.affinity_misses(req(term({"key": "n", "operator": "Lt", "values": ["4"]})), labels) is not None
    assert s.affinity_misses(req(term()), labels) == [[]]  # an empty term matches nothing
    assert s.affinity_misses(req(), labels) == []
    with pytest.raises(ValueError):
        s.affinity_misses(req({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}), labels)


def test_helm_values_merge_like_helm():
    defaults = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert na.merge_values(defaults, {"a": {"c": [3]}, "d": None}) == {"a": {"b": 1, "c": [3]}}
    assert defaults == {"a": {"b": 1, "c": [1, 2]}, "d": 1}


# --- the table ------------------------------------------------------------------------------------------


def test_every_table_fact_names_its_source():
    agents = table.agents()
    assert {"eks-node-monitoring-agent", "amazon-cloudwatch-observability", "nvidia-device-plugin", "aws-efa-k8s-device-plugin", "aws-fsx-csi-driver",
            "aws-efs-csi-driver", "eks-pod-identity-agent", "vpc-cni", "kube-proxy", "dcgm-exporter", "kube-prometheus-stack"} <= set(agents)
    for name, agent in agents.items():
        assert table.names_a_source(agent.source), name
        assert agent.configurable.strip(), name
        for ds_name, ds in agent.daemon_sets.items():
            assert ds.why.strip(), (name, ds_name)
            assert ds.unverified or (ds.tolerations and ds.node_selector and ds.affinity), (name, ds_name)
            for fact in (ds.gap, ds.architectures):
                assert fact is None or table.names_a_source(fact.source), (name, ds_name)
    assert not table.names_a_source("the chart's defaults") and not table.names_a_source("")


def test_the_table_is_read_at_the_versions_we_pin():
    for name, agent in table.agents().items():
        if agent.version.pin and agent.version.ships:
            pinned = getattr(versions, agent.version.pin)
            assert agent.version.ships in pinned, (name, pinned)


def test_a_broken_table_is_refused_with_one_line_per_problem(monkeypatch):
    raw = table.raw()
    bad = copy.deepcopy(raw)
    bad["agents"]["kube-proxy"]["daemonSets"]["kube-proxy"]["mustRunOn"] = ["everywhere"]
    bad["agents"]["vpc-cni"]["colour"] = "blue"
    with pytest.raises(ValueError) as err:
        table.parse(bad)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and any("colour" in line for line in lines) and any("mustRunOn" in line for line in lines)
    unsourced = copy.deepcopy(raw)
    unsourced["agents"]["dcgm-exporter"]["source"] = "its values.yaml"
    with pytest.raises(ValueError, match="dcgm-exporter.source: names no repository"):
        table.parse(unsourced)
    monkeypatch.setattr(versions, "DCGM_EXPORTER_VERSION", "4.9.0")
    with pytest.raises(ValueError, match="read them again"):
        table.parse(copy.deepcopy(raw))


def test_findings_name_the_agent_the_node_and_the_reason():
    f = na.Finding("a", "ds", "NodePool gpu-pool (g5.xlarge, amd64)", (na.Problem("taint", "does not tolerate taint nvidia.com/gpu=:NoSchedule"),))
    assert str(f) == "a/ds on NodePool gpu-pool (g5.xlarge, amd64): does not tolerate taint nvidia.com/gpu=:NoSchedule"
    assert dataclasses.replace(f, accepted="why").__str__().endswith("(known gap: why)")
