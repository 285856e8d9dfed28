"""Mandatory platform rules, as pure functions over the stack's resources.

Each rule takes every resource of the stack (type, name, URN, properties, property
dependencies) and the pack's config, and returns violations. The same rules run

* in ``pulumi preview --policy-pack policy`` (``policy/__main__.py`` wires them into
  ``pulumi_policy`` stack validations), and
* offline over a rendered ``plan.json`` (``python -m policy.check out/dev/plan.json``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from config.cidrs import too_open  # standard library only: the pack's virtualenv has pulumi-policy alone

REQUIRED_LOG_TYPES = {"api", "audit", "authenticator", "controllerManager", "scheduler"}
SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)", re.I)
GPU_FAMILY = re.compile(r"^(g|p)\d")
K8S = "kubernetes:"


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    urn: str
    props: dict
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    rule: str
    urn: str
    message: str


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[list[Resource], dict], Iterable[Violation]]


def _kind(r: Resource) -> str:
    return r.type.rsplit(":", 1)[-1] if r.type.startswith(K8S) else ""


# --- rules -------------------------------------------------------------------------------------


def node_groups_in_private_subnets(resources: list[Resource], config: dict) -> Iterable[Violation]:
    by_urn = {r.urn: r for r in resources}
    for r in resources:
        if r.type == "eks:index:Cluster" and r.props.get("nodeAssociatePublicIpAddress") is not False:
            yield Violation("node-groups-private", r.urn, "nodes must not get public IPs (nodeAssociatePublicIpAddress: false)")
        if r.type != "eks:index:ManagedNodeGroup":
            continue
        for urn in r.property_dependencies.get("subnetIds", []):
            subnet = by_urn.get(urn)
            if subnet is None or subnet.type != "aws:ec2/subnet:Subnet":
                continue
            tags = subnet.props.get("tags") or {}
            if subnet.props.get("mapPublicIpOnLaunch") or "kubernetes.io/role/elb" in tags or "kubernetes.io/role/internal-elb" not in tags:
                yield Violation("node-groups-private", r.urn, f"node group {r.name} uses subnet {subnet.name}, which is not a private subnet")


def imdsv2_required(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        # pulumi-eks's enableIMDSv2 template has hop limit 2 (pods reach the node's credentials):
        # a managed node group must bring its own launch template, checked below
        if r.type == "eks:index:ManagedNodeGroup" and not r.props.get("launchTemplate"):
            yield Violation("imdsv2-required", r.urn, f"node group {r.name} must use the platform's launch template (IMDSv2, hop limit 1)")
        if _kind(r) == "EC2NodeClass":
            tokens = ((r.props.get("spec") or {}).get("metadataOptions") or {}).get("httpTokens")
            if tokens != "required":
                yield Violation("imdsv2-required", r.urn, f"EC2NodeClass {r.name} must set metadataOptions.httpTokens: required")
        if r.type == "aws:ec2/launchTemplate:LaunchTemplate":
            options = r.props.get("metadataOptions") or {}
            if options.get("httpTokens") != "required" or int(options.get("httpPutResponseHopLimit") or 2) != 1:
                yield Violation("imdsv2-required", r.urn, f"launch template {r.name} must require IMDSv2 tokens with a hop limit of 1")


def public_endpoint_restricted(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        if r.type != "eks:index:Cluster" or r.props.get("endpointPublicAccess") is not True:
            continue
        cidrs = r.props.get("publicAccessCidrs") or []
        if not cidrs:
            yield Violation("public-endpoint-restricted", r.urn, "a public endpoint needs publicAccessCidrs (it defaults to 0.0.0.0/0)")
        elif (why := too_open(cidrs)) and not config.get("allowPublicEndpointAnywhere"):
            yield Violation("public-endpoint-restricted", r.urn, f"publicAccessCidrs: {why} (set allowPublicEndpointAnywhere in the pack config to accept)")


def control_plane_logging(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        if r.type == "eks:index:Cluster":
            missing = REQUIRED_LOG_TYPES - set(r.props.get("enabledClusterLogTypes") or [])
            if missing:
                yield Violation("control-plane-logging", r.urn, "control-plane log types missing: " + ", ".join(sorted(missing)))


def _is_gpu_pool(spec: dict) -> bool:
    if "nvidia.com/gpu" in (spec.get("limits") or {}):
        return True
    for req in ((spec.get("template") or {}).get("spec") or {}).get("requirements") or []:
        key, values = req.get("key", ""), req.get("values") or []
        if key.endswith("instance-gpu-count") or key.endswith("instance-gpu-manufacturer"):
            return True
        if key.endswith(("instance-category",)) and set(values) & {"g", "p"}:
            return True
        if key.endswith(("instance-family", "instance-type")) and any(GPU_FAMILY.match(v) for v in values):
            return True
    return False


def gpu_nodepools_tainted(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        if _kind(r) != "NodePool":
            continue
        spec = r.props.get("spec") or {}
        if not _is_gpu_pool(spec):
            continue
        taints = ((spec.get("template") or {}).get("spec") or {}).get("taints") or []
        if not any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NoSchedule" for t in taints):
            yield Violation("gpu-nodepools-tainted", r.urn, f"GPU NodePool {r.name} must carry the nvidia.com/gpu:NoSchedule taint")


def training_runtimes_resilient(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        if _kind(r) not in ("ClusterTrainingRuntime", "TrainingRuntime"):
            continue
        jobset = ((r.props.get("spec") or {}).get("template") or {}).get("spec") or {}
        if (jobset.get("failurePolicy") or {}).get("maxRestarts", 0) <= 0:
            yield Violation("training-runtimes-resilient", r.urn, f"runtime {r.name} must set failurePolicy.maxRestarts > 0")
        for job in jobset.get("replicatedJobs") or []:
            annotations = ((((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
            if annotations.get("karpenter.sh/do-not-disrupt") != "true":
                yield Violation("training-runtimes-resilient", r.urn, f"runtime {r.name} job {job.get('name')} pods must be annotated karpenter.sh/do-not-disrupt: \"true\"")


def _images(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "image" and isinstance(v, str):
                yield f"{path}.{k}", v
            else:
                yield from _images(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _images(v, f"{path}[{i}]")


def _pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    return ":" in last and not last.endswith(":latest")


def no_latest_images(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        if not r.type.startswith(K8S):
            continue
        for path, image in _images(r.props):
            if not _pinned(image):
                yield Violation("no-latest-images", r.urn, f"{path.lstrip('.')}: image {image!r} must be pinned to a tag (not latest) or digest")


def _env_lists(value: Any) -> Iterable[list]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "env" and isinstance(v, list):
                yield v
            else:
                yield from _env_lists(v)
    elif isinstance(value, list):
        for v in value:
            yield from _env_lists(v)


def no_plaintext_secrets(resources: list[Resource], config: dict) -> Iterable[Violation]:
    for r in resources:
        if not r.type.startswith(K8S):
            continue
        for env in _env_lists(r.props):
            for e in env:
                if isinstance(e, dict) and SECRET_NAME.search(str(e.get("name", ""))) and e.get("value"):
                    yield Violation("no-plaintext-secrets", r.urn, f"env {e['name']} has a literal value; use valueFrom.secretKeyRef")
        if _kind(r) == "ConfigMap":
            for key in (r.props.get("data") or {}):
                if SECRET_NAME.search(key):
                    yield Violation("no-plaintext-secrets", r.urn, f"ConfigMap key {key} looks like a secret; use a Secret")


RULES = [
    Rule("node-groups-private", "Managed node groups only in private subnets, nodes without public IPs", node_groups_in_private_subnets),
    Rule("imdsv2-required", "IMDSv2 required on every node (node groups, EC2NodeClasses, launch templates)", imdsv2_required),
    Rule("public-endpoint-restricted", "A public EKS endpoint is restricted to listed CIDRs, never 0.0.0.0/0 unless allowed", public_endpoint_restricted),
    Rule("control-plane-logging", "All EKS control-plane log types enabled", control_plane_logging),
    Rule("gpu-nodepools-tainted", "GPU NodePools carry the nvidia.com/gpu:NoSchedule taint", gpu_nodepools_tainted),
    Rule("training-runtimes-resilient", "Training runtimes restart (maxRestarts > 0) and are never disrupted mid-job", training_runtimes_resilient),
    Rule("no-latest-images", "Container images pinned to a tag or digest, never latest", no_latest_images),
    Rule("no-plaintext-secrets", "No secret-looking values in plain env or ConfigMaps", no_plaintext_secrets),
]


def evaluate(resources: list[Resource], config: dict | None = None) -> list[Violation]:
    return [v for rule in RULES for v in rule.check(resources, config or {})]


def from_plan(plan: dict) -> list[Resource]:
    return [Resource(r["type"], r["name"], r["urn"], r.get("inputs") or {}, r.get("propertyDependencies") or {}) for r in plan["resources"]]
