"""Where the node agents run: the values the platform sets on them where a chart default does not fit
our nodes, the node kinds a stack makes, and the check that every agent runs on every node kind it
must (``config/node_agents.yaml`` has each agent's facts and their sources).

Pure functions on plain dicts; ``tools/node_agents.py`` feeds them a rendered plan.

A node kind is one shape of node the stack can have: a managed node group (its AMI's architecture,
its labels and taints), one instance type of a Karpenter or Auto Mode NodePool (the labels the node
gets: the pool's template labels, ``karpenter.sh/nodepool``, the requirement values that are single,
architecture, OS and instance type; Auto Mode nodes also ``eks.amazonaws.com/compute-type: auto``,
the label the EKS User Guide says to select Auto Mode nodes by), and the same GPU node once the
preflight fence has tainted it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from config.node_agents import FENCED, Agent, DaemonSet
from k8s.builders import scheduling as s
from k8s.builders.gpu_objects import EFA_LABEL, GPU_TAINT

TOLERATE_ALL = {"operator": "Exists"}
ARCH = "kubernetes.io/arch"
OS = "kubernetes.io/os"
NODEPOOL = "karpenter.sh/nodepool"
COMPUTE_TYPE = "eks.amazonaws.com/compute-type"
AUTO_MODE_GROUP = "eks.amazonaws.com"  # an Auto Mode NodePool's nodeClassRef group
# EKS API Reference, Nodegroup amiType: the enum's names carry the architecture (AL2023_ARM_64_STANDARD,
# AL2023_x86_64_NVIDIA, BOTTLEROCKET_ARM_64, ...)
_AMI_ARCH = ((re.compile(r"ARM_64"), "arm64"), (re.compile(r"x86_64"), "amd64"))
# EKS API Reference, Taint effect: the node group API's names for the Kubernetes effects
_EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


# --- the values we set -----------------------------------------------------------------------------

# The keys the add-on's configuration accepts (aws/eks-node-monitoring-agent v1.7.0
# charts/configuration.schema.json, additionalProperties false at each level): EKS refuses any other.
NODE_MONITORING_AGENT_SCHEMA: dict[str, frozenset[str]] = {
    "global": frozenset({"podLabels", "podAnnotations"}),
    "nodeAgent": frozenset({"affinity", "additionalArgs", "podAnnotations", "podLabels", "nodeSelector", "priorityClassName", "probePort", "resources", "resizePolicy", "tolerations", "monitors"}),
    "dcgmAgent": frozenset({"affinity", "podAnnotations", "podLabels", "nodeSelector", "priorityClassName", "resources", "resizePolicy", "tolerations"}),
    "extraObjects": frozenset(),
}


def node_monitoring_agent_configuration() -> dict[str, Any]:
    """The eks-node-monitoring-agent add-on's configuration values. Its DCGM server ships with no
    tolerations (``dcgmAgent.tolerations: []``, v1.7.0 values.yaml), so it never runs on our GPU nodes
    (taint ``nvidia.com/gpu:NoSchedule``) and the agent reports DCGMError there, which Karpenter
    repairs healthy nodes for. Both DaemonSets tolerate every taint: the DCGM server's own affinity
    already keeps it to NVIDIA instance types, and a node the preflight fence tainted keeps its
    monitoring. The agent's default is the same; it is pinned so an add-on update cannot narrow it."""
    return {"nodeAgent": {"tolerations": [dict(TOLERATE_ALL)]}, "dcgmAgent": {"tolerations": [dict(TOLERATE_ALL)]}}


# --- node kinds ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeKind:
    name: str
    tags: frozenset[str]
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...] = ()

    @property
    def arch(self) -> str | None:
        return self.labels.get(ARCH)


def ami_arch(ami_type: str) -> str:
    for pattern, arch in _AMI_ARCH:
        if pattern.search(ami_type):
            return arch
    raise ValueError(f"AMI type {ami_type!r}: no architecture in its name")


def node_group_kinds(node_groups: Sequence[Mapping[str, Any]]) -> list[NodeKind]:
    """``node_groups``: a managed node group's ``name``, ``amiType``, ``instanceTypes``, ``labels``
    and ``taints`` (the EKS node group API's form)."""
    kinds = []
    for ng in node_groups:
        arch = ami_arch(ng["amiType"])
        taints = tuple({"key": t["key"], "value": t.get("value") or "", "effect": _EKS_EFFECTS.get(t["effect"], t["effect"])} for t in ng.get("taints") or [])
        for itype in ng["instanceTypes"]:
            labels = {**(ng.get("labels") or {}), ARCH: arch, OS: "linux", s.INSTANCE_TYPE: itype}
            kinds.append(NodeKind(f"node group {ng['name']} ({itype})", frozenset({"system"}), labels, taints))
    return kinds


def _requirement(reqs: Sequence[Mapping[str, Any]], key: str) -> list[str] | None:
    for r in reqs:
        if r["key"] == key and r["operator"] == "In":
            return list(r["values"])
    return None


def node_pool_kinds(node_pools: Sequence[Mapping[str, Any]]) -> list[NodeKind]:
    """One kind per instance type and architecture of each NodePool manifest (karpenter.sh/v1)."""
    kinds = []
    for pool in node_pools:
        name = pool["metadata"]["name"]
        template = pool["spec"]["template"]
        spec = template["spec"]
        reqs = spec.get("requirements") or []
        taints = tuple(dict(t) for t in [*(spec.get("taints") or []), *(spec.get("startupTaints") or [])])
        gpu = "nvidia.com/gpu" in (pool["spec"].get("limits") or {}) or any(t["key"] == GPU_TAINT["key"] for t in taints)
        if not gpu:
            raise ValueError(f"NodePool {name}: neither limits nor taints nvidia.com/gpu; the node kinds know only GPU pools")
        auto = spec["nodeClassRef"]["group"] == AUTO_MODE_GROUP
        types = _requirement(reqs, s.INSTANCE_TYPE)
        if not types:
            raise ValueError(f"NodePool {name}: no {s.INSTANCE_TYPE} In requirement; the agents' instance-type affinities cannot be judged")
        labels = {**(template.get("metadata") or {}).get("labels", {}), NODEPOOL: name, OS: "linux"}
        labels.update({r["key"]: r["values"][0] for r in reqs if r["operator"] == "In" and len(r["values"]) == 1})
        if auto:
            labels[COMPUTE_TYPE] = "auto"
        tags = {"auto-gpu"} if auto else {"gpu"} | ({"efa-gpu"} if labels.get(EFA_LABEL) == "true" else set())
        for arch in _requirement(reqs, ARCH) or ["amd64", "arm64"]:
            for itype in sorted(types):
                kinds.append(NodeKind(f"NodePool {name} ({itype}, {arch})", frozenset(tags), {**labels, ARCH: arch, s.INSTANCE_TYPE: itype}, taints))
    return kinds


def fenced(kinds: Sequence[NodeKind], taint: Mapping[str, Any]) -> list[NodeKind]:
    """The GPU kinds once a node of theirs carries ``taint`` (the preflight fence's)."""
    return [
        NodeKind(f"{k.name}, fenced", frozenset(FENCED + t for t in k.tags), k.labels, (*k.taints, dict(taint)))
        for k in kinds
        if "system" not in k.tags
    ]


# --- effective values and pod scheduling ----------------------------------------------------------


def merge_values(defaults: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing: our maps merge into the chart's, any other value (lists included) replaces
    it, and a null removes the chart's key."""
    out = copy.deepcopy(dict(defaults))
    for key, value in ours.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def get_path(values: Mapping[str, Any], path: str) -> Any:
    cur: Any = values
    for key in path.split("."):
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    return cur


@dataclass(frozen=True)
class PodScheduling:
    tolerations: list[Mapping[str, Any]]
    node_selector: Mapping[str, str]
    affinity: Mapping[str, Any] | None


def pod_scheduling(ds: DaemonSet, values: Mapping[str, Any]) -> PodScheduling:
    """What the DaemonSet's pod template gets from the chart's templates and ``values`` (the effective values)."""
    assert ds.tolerations is not None and ds.node_selector is not None and ds.affinity is not None, "an unverified DaemonSet has no scheduling facts"
    tol_rule, sel_rule, aff_rule = ds.tolerations, ds.node_selector, ds.affinity
    if tol_rule.all_when and get_path(values, tol_rule.all_when):
        tolerations: list[Mapping[str, Any]] = [dict(TOLERATE_ALL)]
    else:
        listed: list[Mapping[str, Any]] = next((v for v in (get_path(values, p) for p in tol_rule.values) if v is not None), [])
        tolerations = [*tol_rule.template, *listed]
    selector = {**sel_rule.template, **(get_path(values, sel_rule.values) or {} if sel_rule.values else {})}
    if aff_rule.instance_labels:
        labels = get_path(values, aff_rule.instance_labels) or {}
        terms = [{"matchExpressions": [{"key": k, "operator": "In", "values": list(labels.get("values") or [])}, *aff_rule.template]} for k in labels.get("keys") or []]
        affinity: Mapping[str, Any] | None = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    else:
        assert aff_rule.values is not None
        chosen: Mapping[str, Any] = get_path(values, aff_rule.values) or {}
        if aff_rule.when_no_node_affinity:
            default = dict(aff_rule.when_no_node_affinity["nodeAffinity"])
            chosen = {**chosen, "nodeAffinity": {**default, **(chosen.get("nodeAffinity") or {})}}
        affinity = chosen
    return PodScheduling(tolerations, selector, affinity)


# --- the check -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    cause: str  # taint, node-selector, affinity, instance-type, architecture, not-installed, must-not-run
    text: str


@dataclass(frozen=True)
class Finding:
    agent: str
    daemon_set: str
    node_kind: str
    problems: tuple[Problem, ...]
    accepted: str | None = None  # the table's gap that explains it

    def __str__(self) -> str:
        head = f"{self.agent}/{self.daemon_set} on {self.node_kind}: "
        return head + "; ".join(p.text for p in self.problems) + (f" (known gap: {self.accepted})" if self.accepted else "")


def why_not(sched: PodScheduling, ds: DaemonSet, kind: NodeKind) -> list[Problem]:
    """Why a pod of ``ds`` would not be placed on a node of ``kind`` (empty: it would)."""
    out = [Problem("taint", f"does not tolerate taint {t['key']}={t.get('value') or ''}:{t['effect']}") for t in s.untolerated(sched.tolerations, kind.taints)]
    out += [Problem("node-selector", f"nodeSelector {m} not on the node") for m in s.selector_misses(sched.node_selector, kind.labels)]
    misses = s.affinity_misses(sched.affinity, kind.labels)
    if misses is not None:
        only_type = any(term and all(e["key"] == s.INSTANCE_TYPE for e in term) for term in misses)
        terms = " | ".join(" and ".join(s.describe(e, kind.labels) for e in term) or "an empty term" for term in misses) or "no terms"
        out.append(Problem("instance-type" if only_type else "affinity", f"required node affinity fails: {terms}"))
    if ds.architectures and kind.arch not in ds.architectures.values:
        out.append(Problem("architecture", f"image built for {', '.join(ds.architectures.values)}, node is {kind.arch}"))
    return out


@dataclass
class Plan:
    """What a rendered plan says about the agents: each agent's values as installed (None: not
    installed), the node kinds, and the Pulumi resource types it registers."""

    installed: dict[str, Mapping[str, Any] | None]
    kinds: list[NodeKind]
    resource_types: set[str] = field(default_factory=set)


def _required(agent: Agent, plan: Plan) -> bool:
    if agent.required is None:
        return False
    if agent.required == "nodes":
        return any(k.tags & set(ds.must_run_on) for ds in agent.daemon_sets.values() for k in plan.kinds)
    return agent.required in plan.resource_types


def check(agents: Mapping[str, Agent], plan: Plan) -> list[Finding]:
    """Every (agent, DaemonSet, node kind) where an agent the table says must run on that kind would
    not, where it would run on a kind it must not, and every required agent the plan does not install."""
    out: list[Finding] = []
    for name, agent in agents.items():
        ours = plan.installed.get(name)
        if ours is None:
            if _required(agent, plan):
                for ds_name, ds in agent.daemon_sets.items():
                    out += [Finding(name, ds_name, k.name, (Problem("not-installed", f"not installed ({agent.installed_as.model_dump(exclude_none=True)})"),)) for k in plan.kinds if k.tags & set(ds.must_run_on)]
            continue
        values = merge_values(agent.defaults, ours)
        for ds_name, ds in agent.daemon_sets.items():
            if not all(get_path(values, p) for p in ds.enabled_by) or ds.unverified:
                continue
            sched = pod_scheduling(ds, values)
            for kind in plan.kinds:
                must, must_not = kind.tags & set(ds.must_run_on), kind.tags & set(ds.must_not_run_on)
                if not (must or must_not):
                    continue
                problems = why_not(sched, ds, kind)
                if must and problems:
                    accepted = ds.gap.why if ds.gap and all(p.cause == ds.gap.cause for p in problems) else None
                    out.append(Finding(name, ds_name, kind.name, tuple(problems), accepted))
                if must_not and not problems:
                    out.append(Finding(name, ds_name, kind.name, (Problem("must-not-run", f"would run here, where it must not ({', '.join(sorted(must_not))})"),)))
    return out
