"""What a rendered stack asks of the local cluster, read from the program's registrations (what
``pulumi up`` would create): the versions to run, the managed node groups, the access entries, the
Helm releases stood in for, and the Kubernetes objects in the order Pulumi would apply them."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import yaml

from config import aws_facts
from k8s.resources import resource_name
from tools.cluster.sim import NodeGroup
from tools.mock_runtime import ProgramRun, Registration
from tools.render import NOT_MANIFESTS, manifests

MANAGED_NODE_GROUP = "eks:index:ManagedNodeGroup"
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
EKS_TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@dataclass(frozen=True)
class Access:
    """An access entry: the principal and the Kubernetes groups EKS maps it to."""

    principal: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    chart: str
    version: str
    create_namespace: bool
    values: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass
class StackPlan:
    stack: str
    kubernetes_version: str
    trainer_version: str
    releases: list[Release]
    node_groups: list[NodeGroup]
    zones: list[str]
    access: list[Access]
    waves: list[list[dict]]  # Kubernetes objects, in the waves Pulumi would create them
    replace: dict[str, tuple[tuple[str, ...], bool]] = field(default_factory=dict)  # Pulumi name -> (replaceOnChanges, deleteBeforeReplace)

    @property
    def kueue(self) -> Release | None:
        return next((r for r in self.releases if r.name == "kueue"), None)

    def kueue_config(self) -> dict | None:
        release = self.kueue
        if release is None:
            return None
        text = (release.values.get("managerConfig") or {}).get("controllerManagerConfigYaml")
        return yaml.safe_load(text) if text else {}

    def trainer_feature_gates(self) -> dict:
        """The feature gates the stack's Trainer release turns on (its Helm values)."""
        release = next((r for r in self.releases if r.name == "kubeflow-trainer"), None)
        return dict((((release.values if release else {}).get("manager") or {}).get("config") or {}).get("featureGates") or {})

    def karpenter_feature_gates(self) -> str:
        """The FEATURE_GATES the Karpenter chart gives its controller from the stack's values
        (``settings.featureGates.<gate>``, camelCase, as ``<Gate>=<bool>``); empty without Karpenter."""
        release = next((r for r in self.releases if r.name == "karpenter"), None)
        gates = ((release.values if release else {}).get("settings") or {}).get("featureGates") or {}
        return ",".join(f"{k[0].upper()}{k[1:]}={str(bool(v)).lower()}" for k, v in sorted(gates.items()))

    @property
    def objects(self) -> list[dict]:
        return [o for wave in self.waves for o in wave]

    def team_access(self) -> list[Access]:
        return [a for a in self.access if a.groups]


def _is_manifest(reg: Registration) -> bool:
    return reg.custom and reg.type.startswith("kubernetes:") and not reg.type.startswith(NOT_MANIFESTS)


def waves(run: ProgramRun) -> list[list[Registration]]:
    """The Kubernetes objects grouped as the Pulumi engine would create them: an object starts once
    every resource it depends on (``dependsOn``, property dependencies, and every resource inside a
    component it depends on) is created; objects of one wave have no order among themselves, and
    are listed in registration order."""
    by_urn = {r.urn: r for r in run.registrations}
    children: dict[str, list[str]] = collections.defaultdict(list)
    for r in run.registrations:
        if r.parent:
            children[r.parent].append(r.urn)

    def expand(urn: str) -> set[str]:
        reg = by_urn.get(urn)
        if reg is None:
            return set()
        if reg.custom:
            return {urn}
        out: set[str] = set()
        for child in children.get(urn, []):
            out |= expand(child)
        return out

    deps: dict[str, set[str]] = {}
    for r in run.registrations:
        if not r.custom:
            continue
        direct = set(r.depends_on) | {u for urns in r.property_dependencies.values() for u in urns}
        deps[r.urn] = set().union(*(expand(u) for u in direct)) if direct else set()
    level: dict[str, int] = {}

    def depth(urn: str, seen: frozenset = frozenset()) -> int:
        if urn in level:
            return level[urn]
        if urn in seen:
            raise ValueError(f"dependency cycle through {urn}")
        d = 0
        for dep in deps.get(urn, ()):
            if dep in deps:
                d = max(d, depth(dep, seen | {urn}) + 1)
        level[urn] = d
        return d

    for urn in deps:
        depth(urn)
    kube = [r for r in run.registrations if _is_manifest(r)]
    # only Kubernetes objects are applied: a wave is the rank among them (AWS resources are created
    # for real by Pulumi; here they exist already or are stood in for)
    ranks = sorted({level[r.urn] for r in kube})
    return [[r for r in kube if level[r.urn] == rank] for rank in ranks]


def _node_group(reg: Registration) -> NodeGroup:
    inputs = reg.inputs
    taints = [{"key": t["key"], **({"value": t["value"]} if t.get("value") else {}), "effect": EKS_TAINT_EFFECTS.get(t.get("effect", ""), t.get("effect"))} for t in inputs.get("taints") or []]
    arch = "arm64" if "ARM" in str(inputs.get("amiType", "")) else "amd64"
    scaling = inputs.get("scalingConfig") or {}
    name = inputs.get("nodeGroupName") or reg.name
    return NodeGroup(name=name, instance_type=(inputs.get("instanceTypes") or ["c6i.2xlarge"])[0], desired=int(scaling.get("desiredSize", 0)), labels=dict(inputs.get("labels") or {}), taints=taints, arch=arch)


def _zones(run: ProgramRun, region: str) -> list[str]:
    found = sorted({r.inputs["availabilityZone"] for r in run.registrations if r.type == "aws:ec2/subnet:Subnet" and "private" in r.name and r.inputs.get("availabilityZone")})
    if found:
        return found
    if aws_facts.is_known_region(region):
        return aws_facts.account_zones(region)[:3]
    return [f"{region}a", f"{region}b"]


def stack_plan(run: ProgramRun, region: str) -> StackPlan:
    cluster = run.one("eks:index:Cluster").inputs
    releases = [Release(r.inputs.get("name") or r.name, r.inputs.get("namespace", "default"), r.inputs.get("chart", ""), str(r.inputs.get("version", "")), bool(r.inputs.get("createNamespace")), r.inputs.get("values") or {}) for r in run.by_type(HELM_RELEASE)]
    trainer = next((r for r in releases if r.name == "kubeflow-trainer"), None)
    if trainer is None:
        raise ValueError("the stack installs no Kubeflow Trainer release")
    access = [Access(r.inputs["principalArn"], tuple(r.inputs.get("kubernetesGroups") or ())) for r in run.by_type(ACCESS_ENTRY) if r.inputs.get("type", "STANDARD") == "STANDARD"]
    objs = manifests(run)  # file name (the object's Pulumi name + .yaml) -> object
    ordered = [[objs[_resource_name(reg) + ".yaml"] for reg in wave] for wave in waves(run)]
    replace = {_resource_name(r): (tuple(r.replace_on_changes), r.delete_before_replace) for r in run.registrations if _is_manifest(r) and (r.replace_on_changes or r.delete_before_replace)}
    return StackPlan(
        stack=run.stack,
        kubernetes_version=str(cluster.get("version")),
        trainer_version="v" + trainer.version.removeprefix("v"),
        releases=releases,
        node_groups=[_node_group(r) for r in run.by_type(MANAGED_NODE_GROUP)],
        zones=_zones(run, region),
        access=access,
        waves=ordered,
        replace=replace,
    )


def _resource_name(reg: Registration) -> str:
    inputs = {k: v for k, v in reg.inputs.items() if not k.startswith("__")}
    return resource_name(inputs)
