"""Apply the stack's rendered charts (tools/cluster/charts.py) to a local control plane as their
Helm releases would, next to the locally run controllers, and judge where their workloads run.

What is applied for real: everything but the kinds in ``DRY_RUN_ONLY`` and objects that exist
already under another manager (the local cluster's own). Deployments get their replicas; kwok
"runs" their pods on the simulated nodes without containers, so the controllers that do the work
stay the local processes, and the chart's pods show only where the scheduler puts them, under the
Pod Security level of the namespace Helm creates (``createNamespace``: labelled ``name`` only,
helm.sh/helm/v3 pkg/action/install.go) or the stack renders.

Judged:

* every object applies (strict field validation) and reads back whole;
* each Deployment's pods Running, all on nodes of the kind the stack means for controllers (the
  managed node groups, ``training-platform/node-role: system``), on an architecture their image is
  built for (the release's own build files, ``IMAGE_BUILDS``);
* each DaemonSet's desired and ready counts equal the nodes of the kinds it must cover
  (``DAEMONSET_NODES``; none of the charts rendered here has a DaemonSet at the pinned versions);
* each controller's service account may do what the controller's generated RBAC role (the module's
  kubebuilder output, ``IMAGE_BUILDS``) asks, through the chart's RBAC (SubjectAccessReviews).
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

import versions
from config.labels import NODE_ROLE_LABEL
from tools.cluster import build
from tools.cluster.apply import differences, dry_create, dry_create_renamed, dry_run, label
from tools.cluster.charts import Rendered
from tools.cluster.client import ApiError, Client
from tools.cluster.plan import StackPlan

HELM_MANAGER = "helm"  # the field manager of what the charts apply here

_WEBHOOKS = ("it calls the chart's Service, whose pods run no container here: with failurePolicy Fail it would refuse every object it hooks;"
             " the local controllers' own registrations of the same webhooks (tools/cluster/components.py) stay")
DRY_RUN_ONLY = {
    "CustomResourceDefinition": "the local control plane serves the same release's CRDs from the module's own config (components.crds); the chart's copy must not replace them under the running controllers (a CRD it does not serve is installed: _install_crd)",
    "MutatingWebhookConfiguration": _WEBHOOKS,
    "ValidatingWebhookConfiguration": _WEBHOOKS,
    "APIService": "an aggregated API whose Service has no server behind it makes API discovery fail for every client",
}

# Node kinds: what the stack means a node for.
SYSTEM, GPU = "system", "gpu"
CONTROLLER_NODES = SYSTEM  # the platform's controllers run on the managed node groups
# (release, DaemonSet name) -> the node kinds it must run on, exactly
DAEMONSET_NODES: dict[tuple[str, str], frozenset[str]] = {}


@dataclass(frozen=True)
class ImageBuild:
    """Where a release's image is built, read from its module at the pinned version: the platforms
    it is published for and the RBAC role its controller's code generates. Where no module the
    local cluster can download holds the build (``module`` None), ``platforms`` and ``rules`` are
    those facts as read from the release, ``platforms_file`` naming where."""

    module: str | None
    platforms_file: str
    platforms_pattern: str  # a regex whose group 1 lists the platforms
    role_file: str | None  # kubebuilder's generated role (None: the chart is the only RBAC source, or ``rules``)
    platforms: frozenset[str] = frozenset()
    rules: tuple[dict, ...] = ()
    rules_source: str = ""


def _rule(groups: tuple[str, ...], resources: tuple[str, ...], verbs: tuple[str, ...]) -> dict:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


# What the AWS Load Balancer Controller's code asks for serving Ingresses, from its generated role
# (kubernetes-sigs/aws-load-balancer-controller v3.5.0 config/rbac/role.yaml, the kubebuilder
# markers' output; its Gateway API and Global Accelerator rules left out: the platform uses neither).
# Its module (sigs.k8s.io/aws-load-balancer-controller/v3) is not on the module proxy (versions.py).
ALB_CONTROLLER_RULES = (
    _rule(("",), ("endpoints", "namespaces", "nodes", "pods"), ("get", "list", "watch")),
    _rule(("",), ("events",), ("create", "patch")),
    _rule(("",), ("pods/status", "services/status"), ("patch", "update")),
    _rule(("",), ("services",), ("get", "list", "patch", "update", "watch")),
    _rule(("discovery.k8s.io",), ("endpointslices",), ("get", "list", "watch")),
    _rule(("elbv2.k8s.aws",), ("ingressclassparams",), ("get", "list", "watch")),
    _rule(("elbv2.k8s.aws",), ("targetgroupbindings",), ("create", "delete", "get", "list", "patch", "update", "watch")),
    _rule(("elbv2.k8s.aws",), ("targetgroupbindings/status",), ("patch", "update")),
    _rule(("extensions", "networking.k8s.io"), ("ingresses",), ("get", "list", "patch", "update", "watch")),
    _rule(("extensions", "networking.k8s.io"), ("ingresses/status",), ("patch", "update")),
    _rule(("networking.k8s.io",), ("ingressclasses",), ("get", "list", "watch")),
)


# image repository (as a chart names it, any registry) -> its build
IMAGE_BUILDS: dict[str, ImageBuild] = {
    # .github/workflows/build-and-push-images.yaml: the matrix entry of the controller
    "kubeflow/trainer/trainer-controller-manager": ImageBuild(versions.TRAINER_MODULE, ".github/workflows/build-and-push-images.yaml",
                                                              r"component-name: trainer-controller-manager\s+dockerfile: \S+\s+platforms: (\S+)", "manifests/base/rbac/role.yaml"),
    # Makefile: PLATFORMS ?= ... (image-build / image-push)
    "jobset/jobset": ImageBuild(versions.JOBSET_MODULE, "Makefile", r"(?m)^PLATFORMS \?= (\S+)", "config/components/rbac/role.yaml"),
    "kueue/kueue": ImageBuild(versions.KUEUE_MODULE, "Makefile", r"(?m)^PLATFORMS \?= (\S+)", "config/components/rbac/role.yaml"),
    # .ko.yaml: defaultPlatforms (ko publish in hack/release/common.sh)
    "karpenter/controller": ImageBuild(versions.KARPENTER_AWS_MODULE, ".ko.yaml", r"defaultPlatforms:\s*\n((?:\s+- \S+\n)+)", None),
    # kubernetes-sigs/aws-load-balancer-controller v3.5.0 Makefile: IMG_PLATFORM ?= linux/amd64,linux/arm64 (ko build --platform)
    "eks/aws-load-balancer-controller": ImageBuild(None, "kubernetes-sigs/aws-load-balancer-controller v3.5.0 Makefile (IMG_PLATFORM)", "", None,
                                                   platforms=frozenset({"amd64", "arm64"}), rules=ALB_CONTROLLER_RULES,
                                                   rules_source="kubernetes-sigs/aws-load-balancer-controller v3.5.0 config/rbac/role.yaml"),
}


def module_version(module: str, plan: StackPlan) -> str:
    return {
        versions.TRAINER_MODULE: plan.trainer_version,
        versions.JOBSET_MODULE: versions.TRAINER_VERSIONS[plan.trainer_version]["jobset"],
        versions.KUEUE_MODULE: "v" + versions.KUEUE_VERSION,
        versions.KARPENTER_AWS_MODULE: "v" + versions.KARPENTER_VERSION,
    }[module]


def image_build(image: str) -> ImageBuild | None:
    repo = image.split("@", 1)[0].rsplit(":", 1)[0] if "/" in image else image
    return next((b for suffix, b in IMAGE_BUILDS.items() if repo == suffix or repo.endswith("/" + suffix)), None)


@functools.cache
def _module_file(module: str, version: str, path: str) -> str:
    return (build.module_dir(module, version) / path).read_text()


def image_architectures(b: ImageBuild, plan: StackPlan) -> set[str]:
    """The Linux architectures the image is published for, from its release's build file."""
    if b.module is None:
        return set(b.platforms)
    m = re.search(b.platforms_pattern, _module_file(b.module, module_version(b.module, plan), b.platforms_file))
    if m is None:
        raise ValueError(f"{b.module} {b.platforms_file}: no platform list (/{b.platforms_pattern}/)")
    return set(re.findall(r"linux/([a-z0-9]+)", m.group(1)))


@dataclass
class Applied:
    release: str
    objects: list[dict] = field(default_factory=list)  # applied for real, as sent
    dry_run: dict[str, str] = field(default_factory=dict)  # label -> why only a dry run
    problems: list[str] = field(default_factory=list)

    def workloads(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]


def _with_release(obj: dict, release: str, namespace: str, client: Client) -> dict:
    """As Helm sends it: the release namespace on namespaced objects that name none, and Helm's
    ownership label and annotations (pkg/action setMetadataVisitor)."""
    obj = _without_nulls(copy.deepcopy(obj))
    meta = obj.setdefault("metadata", {})
    if client.kind(obj["apiVersion"], obj["kind"]).namespaced:
        meta.setdefault("namespace", namespace)
    meta["labels"] = {**(meta.get("labels") or {}), "app.kubernetes.io/managed-by": "Helm"}
    meta["annotations"] = {**(meta.get("annotations") or {}), "meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}
    return obj


def _without_nulls(value: Any) -> Any:
    """A map's null fields left out: the API server decodes a null as no value and defaults it, as
    if it were not sent (the ALB controller chart's ``objectSelector:`` with nothing under it, from
    its null ``webhookConfig.ingressValidationObjectSelector`` keys, is read back as ``{}``)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _managers(live: dict) -> set[str]:
    return {m.get("manager", "") for m in live["metadata"].get("managedFields") or []}


def _dry_run(client: Client, obj: dict) -> list[str]:
    """A server-side dry run of the chart's object as Helm would create it. Where the local cluster
    has its own of that name (its webhook registrations), the chart's is created, dry, under another
    name: merged into the local one it would be judged against fields that are not the chart's. A CRD
    is the same release's (components.crds): the dry run updates it, as an upgrade would; so is an
    APIService (Kueue's visibility API, components.kueue_visibility_objects), whose name must be its
    version and group and so cannot be taken by a copy."""
    if obj["kind"] in ("CustomResourceDefinition", "APIService"):
        return dry_run(client, obj)
    created = dry_create(client, obj)
    return created if created is not None else dry_create_renamed(client, obj, "-chart")


def _apply(client: Client, obj: dict, out: Applied) -> None:
    meta = obj["metadata"]
    if obj["kind"] == "CustomResourceDefinition" and client.get_or_none(obj["apiVersion"], obj["kind"], meta["name"]) is None:
        _install_crd(client, obj, out)  # no local component serves it: nothing to replace
        return
    if obj["kind"] in DRY_RUN_ONLY:
        out.dry_run[label(obj)] = DRY_RUN_ONLY[obj["kind"]]
        out.problems += _dry_run(client, obj)
        return
    live = client.get_or_none(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
    if live is not None and HELM_MANAGER not in _managers(live):
        out.dry_run[label(obj)] = f"it exists already, made by {', '.join(sorted(_managers(live))) or 'someone else'}: judged by a dry run, left as it is"
        out.problems += _dry_run(client, obj)
        return
    live = _applied(client, obj, out)
    if live is not None:
        out.problems += [f"{label(obj)}: {d}" for d in differences({k: v for k, v in obj.items() if k != "status"}, live)]


def _applied(client: Client, obj: dict, out: Applied) -> dict | None:
    """``obj`` applied as Helm's field manager (recorded in ``out``), or None with the refusal recorded."""
    try:
        live = client.apply(obj, manager=HELM_MANAGER)
    except ApiError as err:
        out.problems.append(f"{label(obj)}: refused by the API server (HTTP {err.status}): {err}")
        return None
    out.objects.append(obj)
    return live


def _install_crd(client: Client, obj: dict, out: Applied, timeout_s: float = 60) -> None:
    """A chart CRD the local cluster does not serve (the ALB controller's), installed as Helm installs
    a chart's crds/: created, then waited for (60 s) until the API server serves it
    (helm.sh/helm/v3 v3.20.2 pkg/action/install.go installCRDs: Create, then Wait(..., 60*time.Second))."""
    import time

    live = _applied(client, obj, out)
    if live is None:
        return
    deadline = time.monotonic() + timeout_s
    while not any(c.get("type") == "Established" and c.get("status") == "True" for c in (live.get("status") or {}).get("conditions") or []):
        if time.monotonic() > deadline:
            out.problems.append(f"{label(obj)}: not Established after {timeout_s:.0f} s")
            return
        time.sleep(0.2)
        live = client.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def apply_release(client: Client, rendered: Rendered) -> Applied:
    """Apply one rendered release: its namespace (when the release creates it), its crds/ (dry run),
    pre-install hooks, manifests in Helm's install order, post-install hooks."""
    release = rendered.release
    out = Applied(release.name)
    if release.create_namespace:
        client.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release.namespace, "labels": {"name": release.namespace}}}, manager=HELM_MANAGER)
    hooks = sorted(rendered.hooks, key=lambda h: h["weight"])
    for phase in ("crds", "pre-install", None, "post-install"):
        if phase == "crds":
            objs = rendered.crds
        else:
            objs = [h["object"] for h in hooks if phase in h["events"]] if phase else rendered.manifests
        for obj in objs:
            try:
                obj = _with_release(obj, release.name, release.namespace, client)
            except ApiError as err:  # a kind the cluster does not serve: Helm's install fails on it too
                out.problems.append(f"{label(obj)}: {err}")
                continue
            _apply(client, obj, out)
    return out


# --- where the workloads run ---------------------------------------------------------------------------

def node_kind(node: dict) -> str:
    labels = node["metadata"].get("labels") or {}
    if labels.get(NODE_ROLE_LABEL) == "system":
        return SYSTEM
    if labels.get("karpenter.sh/nodepool"):
        return GPU
    return "other"


def selector(match: dict) -> str:
    """A label selector (matchLabels, matchExpressions) as the API's labelSelector parameter."""
    parts = [f"{k}={v}" for k, v in (match.get("matchLabels") or {}).items()]
    for e in match.get("matchExpressions") or []:
        op, key, vals = e["operator"], e["key"], ",".join(e.get("values") or [])
        parts.append({"In": f"{key} in ({vals})", "NotIn": f"{key} notin ({vals})", "Exists": key, "DoesNotExist": f"!{key}"}[op])
    return ",".join(parts)


def pods(client: Client, workload: dict) -> list[dict]:
    meta = workload["metadata"]
    found = client.list("v1", "Pod", meta["namespace"], label_selector=selector(workload["spec"]["selector"]))
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def _running(pod: dict) -> bool:
    return pod["status"].get("phase") == "Running" and bool(pod["spec"].get("nodeName"))


def _why_not_running(client: Client, workload: dict, found: list[dict]) -> str:
    """The scheduler's or the ReplicaSet controller's word on a workload that is not running."""
    meta = workload["metadata"]
    words = []
    for pod in found:
        for c in pod["status"].get("conditions") or []:
            if c.get("status") == "False" and c.get("message"):
                words.append(f"pod {pod['metadata']['name']}: {c['message']}")
    for rs in client.list("apps/v1", "ReplicaSet", meta["namespace"], label_selector=selector(workload["spec"]["selector"])):
        for c in rs.get("status", {}).get("conditions") or []:
            if c.get("type") == "ReplicaFailure":
                words.append(f"ReplicaSet {rs['metadata']['name']}: {c.get('message')}")
    return "; ".join(words) or f"{len(found)} pods, none Running"


def deployment_placement(client: Client, deployment: dict, plan: StackPlan) -> list[str] | None:
    """None while the Deployment's pods are not all Running; else its problems: pods on nodes of
    another kind, or of an architecture its images are not built for."""
    want = int(deployment["spec"].get("replicas", 1))
    found = pods(client, deployment)
    running = [p for p in found if _running(p)]
    if len(running) < want:
        return None
    problems = []
    for pod in running:
        node = client.get("v1", "Node", pod["spec"]["nodeName"])
        kind, arch = node_kind(node), node["metadata"]["labels"].get("kubernetes.io/arch")
        where = f"{label(deployment)}: pod {pod['metadata']['name']} on node {node['metadata']['name']}"
        if kind != CONTROLLER_NODES:
            problems.append(f"{where}: a {kind} node, not a {CONTROLLER_NODES} node")
        for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
            b = image_build(c["image"])
            if b is None:
                problems.append(f"{where}: no build facts for image {c['image']} (tools/cluster/chart_apply.IMAGE_BUILDS)")
            elif arch not in (archs := image_architectures(b, plan)):
                problems.append(f"{where}: {arch}, but image {c['image']} is built for {', '.join(sorted(archs))} ({b.module} {b.platforms_file})")
    return problems


def not_running(client: Client, deployment: dict) -> str:
    return f"{label(deployment)}: {_why_not_running(client, deployment, pods(client, deployment))}"


def daemonset_coverage(client: Client, release: str, daemonset: dict) -> list[str] | None:
    """None while the DaemonSet controller has not counted; else its problems: desired or ready
    counts that differ from the nodes of the kinds it must run on."""
    meta = daemonset["metadata"]
    must = DAEMONSET_NODES.get((release, meta["name"]))
    if must is None:
        return [f"{label(daemonset)} of release {release}: no statement of the node kinds it must run on (chart_apply.DAEMONSET_NODES)"]
    live = client.get("apps/v1", "DaemonSet", meta["name"], meta["namespace"])
    status = live.get("status") or {}
    if status.get("observedGeneration", 0) < live["metadata"].get("generation", 1):
        return None
    nodes = [n for n in client.list("v1", "Node") if node_kind(n) in must]
    desired, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
    if ready < desired:
        return None
    if desired != len(nodes):
        return [f"{label(daemonset)}: scheduled on {desired} nodes, the {', '.join(sorted(must))} nodes are {len(nodes)}"]
    return []


# --- RBAC: what the controller's code asks of the chart's roles ----------------------------------------

def required_rules(b: ImageBuild, plan: StackPlan) -> list[dict]:
    if b.module is None or b.role_file is None:
        return list(b.rules)
    docs = yaml.safe_load_all(_module_file(b.module, module_version(b.module, plan), b.role_file))
    return [rule for d in docs if d and d.get("kind") == "ClusterRole" for rule in d.get("rules") or []]


def service_account_may(client: Client, namespace: str, name: str, attrs: dict) -> bool:
    """Whether the service account may do ``attrs`` (a SubjectAccessReview's resourceAttributes),
    asked of the API server as the account with its groups."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": f"system:serviceaccount:{namespace}:{name}", "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"], "resourceAttributes": attrs}}
    return bool((client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review).get("status") or {}).get("allowed"))


def rbac_gaps(client: Client, deployment: dict, plan: StackPlan, release_objects: list[dict] | None = None) -> list[str]:
    """What the Deployment's controller needs (its generated ClusterRole) that its service account
    may not do, each asked of the API server as a SubjectAccessReview. A rule limited to named
    objects names them as the module's kustomize base does, before its name prefix: each is asked
    for the release's object of that kind whose name ends with it (``release_objects``), if any."""
    pod = deployment["spec"]["template"]["spec"]
    ns, sa = deployment["metadata"]["namespace"], pod.get("serviceAccountName") or "default"
    user = f"system:serviceaccount:{ns}:{sa}"
    released = [(o["kind"].lower() + "s", o["metadata"]["name"]) for o in release_objects or []]
    gaps = []
    for c in pod.get("containers", []):
        b = image_build(c["image"])
        if b is None:
            continue  # an image without build facts: deployment_placement names it
        for rule in required_rules(b, plan):
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    res, _, sub = resource.partition("/")
                    names: list[str | None] = [None]
                    if rule.get("resourceNames"):
                        names = [next((n for r, n in released if r == res and n.endswith(want)), want) for want in rule["resourceNames"]]
                    for verb in rule.get("verbs") or []:
                        for name in names:
                            attrs = {"group": group, "resource": res, "verb": verb, **({"subresource": sub} if sub else {}), **({"name": name} if name else {})}
                            if not service_account_may(client, ns, sa, attrs):
                                what = f"{resource}{'.' + group if group else ''}{' ' + name if name else ''}"
                                gaps.append(f"{label(deployment)}: {user} may not {verb} {what} (what {b.rules_source or f'{b.module} {b.role_file}'} grants)")
    return gaps


def served_api_versions(client: Client) -> list[str]:
    """What the API server serves, as Helm's ``.Capabilities.APIVersions`` lists it on install
    (``group/version`` and ``group/version/Kind``; pkg/action GetVersionSet)."""
    out = ["v1"] + [f"v1/{r['kind']}" for r in client.get_path("/api/v1").get("resources", []) if "/" not in r["name"]]
    for group in client.get_path("/apis").get("groups", []):
        for gv in group.get("versions", []):
            out.append(gv["groupVersion"])
            out += [f"{gv['groupVersion']}/{r['kind']}" for r in client.get_path(f"/apis/{gv['groupVersion']}").get("resources", []) if "/" not in r["name"]]
    return sorted(set(out))
