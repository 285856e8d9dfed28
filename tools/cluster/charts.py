"""The stack's Helm releases rendered by their real charts, with the stack's values.

The local control plane runs the Trainer, JobSet, Kueue and Karpenter as local processes, so it never
sees what their charts make of our values. Where a release's chart ships in a Go module the local
cluster already downloads, this renders it as ``helm template`` would (the Helm SDK at
``versions.HELM_VERSION``, ``helm_template.go``) from the module's chart directory at the release's
version, and checks our values' keys against the chart first:

* ``values.schema.json`` makes Helm refuse unknown keys where a chart has one; none of these charts
  has one at the pinned versions, so every key we set must be in the chart's ``values.yaml`` (or,
  for a key the file leaves out, read by a template as ``.Values.<path>``). An empty map in
  ``values.yaml`` (``nodeSelector: {}``) takes any keys.
* A chart's dependencies are in the published chart's ``charts/`` (``helm package`` after
  ``helm dependency update``); here each comes from its own module (the Trainer's JobSet from
  ``sigs.k8s.io/jobset`` at the version the Trainer release pins), and one without a module may
  only stay disabled.
* Karpenter's release build rewrites the chart's ``version``/``appVersion`` and image at publish
  (karpenter-provider-aws hack/release/common.sh ``publishHelmChart``, ``build``): the tag's
  ``Chart.yaml`` still names the previous release, the templates are the published ones.
* Trainer v2.1.0's release build appends ``appVersion: <tag>`` to ``Chart.yaml`` before
  ``helm package`` (kubeflow/trainer v2.1.0 .github/workflows/publish-helm-charts.yaml, "Update
  appVersion in Chart.yaml"); the tag's ``Chart.yaml`` has none, and its ``trainer.image`` helper
  tags the manager's image with ``.Chart.AppVersion``. v2.3.0's workflow adds none (its templates
  tag images from ``.Chart.Version``): ``TRAINER_PUBLISHED_APP_VERSION``.

* The AWS Load Balancer Controller's chart (the portal's, ``portal.enabled`` on a self-managed GPU
  pool) comes from the eks-charts repository's module (``versions.EKS_CHARTS_MODULE``): the
  controller's own module is not served by the module proxy.

Charts in no such module (the NVIDIA and EFA device plugins, dcgm-exporter, kube-prometheus-stack)
are not rendered here: ``not_rendered`` says why.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import yaml

import versions
from tools.cluster import build
from tools.cluster.plan import Release, StackPlan

VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
INDEX_REF = re.compile(r"index\s+\$?\.Values((?:\s+\"[^\"]+\")+)")


# The Trainer releases whose chart publishing appends ``appVersion: <the release tag>`` to Chart.yaml:
# v2.1.0 (kubeflow/trainer v2.1.0 .github/workflows/publish-helm-charts.yaml: APP_VERSION is
# GITHUB_REF without refs/tags/, `echo "appVersion: ${APP_VERSION}" >> charts/kubeflow-trainer/Chart.yaml`);
# v2.3.0's publish-helm-charts.yaml has no such step.
TRAINER_PUBLISHED_APP_VERSION = frozenset({"v2.1.0"})


class ChartError(Exception):
    """A chart that cannot be rendered with the stack's values: one line per problem."""


@dataclass(frozen=True)
class ChartSource:
    """Where a release's chart lives: a chart directory of a Go module at a version."""

    module: str
    module_version: str
    path: str
    chart_version: str  # the version the release installs
    published_version_rewritten: bool = False  # Karpenter: the tag's Chart.yaml names the previous release
    published_app_version: str = ""  # appended to Chart.yaml by the release build (Trainer v2.1.0: its tag)
    subcharts: tuple[ChartSource, ...] = ()

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return f"{self.module}@{self.module_version} {self.path}"


@dataclass
class Rendered:
    release: Release
    source: ChartSource
    manifests: list[dict]  # Helm's install order
    hooks: list[dict] = field(default_factory=list)  # {"events", "weight", "object"}
    crds: list[dict] = field(default_factory=list)  # the chart's crds/ directory (installed before the rest)
    notes: str = ""


def chart_source(release: Release) -> ChartSource | None:
    """The module chart behind ``release`` (None when no module the local cluster builds ships it)."""
    if release.chart == versions.TRAINER_CHART:
        trainer = "v" + release.version.removeprefix("v")
        if trainer not in versions.TRAINER_VERSIONS:
            raise ChartError(f"release {release.name}: Trainer chart {release.version} is not a pinned Trainer release ({', '.join(versions.TRAINER_VERSIONS)})")
        jobset = versions.TRAINER_VERSIONS[trainer]["jobset"]
        sub = ChartSource(versions.JOBSET_MODULE, jobset, "charts/jobset", jobset.removeprefix("v"))
        app_version = trainer if trainer in TRAINER_PUBLISHED_APP_VERSION else ""
        return ChartSource(versions.TRAINER_MODULE, trainer, "charts/kubeflow-trainer", versions.TRAINER_VERSIONS[trainer]["chart"], published_app_version=app_version, subcharts=(sub,))
    if release.chart == versions.KUEUE_CHART:
        return ChartSource(versions.KUEUE_MODULE, "v" + versions.KUEUE_VERSION, "charts/kueue", versions.KUEUE_VERSION)
    if release.chart == versions.KARPENTER_CHART:
        return ChartSource(versions.KARPENTER_AWS_MODULE, "v" + versions.KARPENTER_VERSION, "charts/karpenter", versions.KARPENTER_VERSION, published_version_rewritten=True)
    if release.chart == versions.ALB_CONTROLLER_CHART and release.version == versions.ALB_CONTROLLER_VERSION:
        # the eks-charts repository's source (versions.EKS_CHARTS_MODULE says why not the controller's module)
        return ChartSource(versions.EKS_CHARTS_MODULE, versions.EKS_CHARTS_MODULE_VERSION, "stable/aws-load-balancer-controller", versions.ALB_CONTROLLER_VERSION)
    return None


def flattened(docs: list[dict]) -> list[dict]:
    """Objects as Helm sends them: a ``v1`` ``List`` is its items (Helm's kube client builds the
    manifests with ``resource.Builder.Flatten()``, helm.sh/helm/v3 v3.20.2 pkg/kube/client.go
    ``newBuilder``); the ALB controller chart's IngressClassParams and IngressClass come as one."""
    out: list[dict] = []
    for doc in docs:
        if doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
            out += flattened([i for i in doc.get("items") or [] if i])
        else:
            out.append(doc)
    return out


def not_rendered(plan: StackPlan) -> dict[str, str]:
    """Release name -> why its chart is not rendered on the local control plane."""
    return {r.name: not_rendered_reason(r) for r in plan.releases if chart_source(r) is None}


# --- the chart directory ----------------------------------------------------------------------------

def _copy(src: pathlib.Path, dst: pathlib.Path) -> None:
    """A writable copy (the Go module cache is read-only)."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def assemble(source: ChartSource, dest: pathlib.Path) -> pathlib.Path:
    """The chart as its release publishes it, under ``dest``: its directory, its dependencies in
    ``charts/`` from their own modules."""
    chart_dir = build.module_dir(source.module, source.module_version) / source.path
    if not (chart_dir / "Chart.yaml").is_file():
        raise ChartError(f"{source} holds no chart")
    out = dest / source.name
    _copy(chart_dir, out)
    meta = yaml.safe_load((out / "Chart.yaml").read_text())
    if source.published_version_rewritten:
        meta["version"] = meta["appVersion"] = source.chart_version
        (out / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    elif str(meta.get("version")).removeprefix("v") != source.chart_version:
        raise ChartError(f"{source}: Chart.yaml says version {meta.get('version')}, the release installs {source.chart_version}")
    if source.published_app_version:
        if "appVersion" in meta:
            raise ChartError(f"{source}: Chart.yaml already has appVersion {meta['appVersion']}, its release build appends one")
        with open(out / "Chart.yaml", "a") as fh:  # as the release build does: a line at the end
            fh.write(f"\nappVersion: {source.published_app_version}\n")
        meta["appVersion"] = source.published_app_version
    wanted = {d["name"]: str(d.get("version", "")) for d in meta.get("dependencies") or []}
    for sub in source.subcharts:
        if sub.name not in wanted:
            raise ChartError(f"{source}: Chart.yaml has no dependency {sub.name}")
        if wanted[sub.name].removeprefix("v") != sub.chart_version:
            raise ChartError(f"{source}: Chart.yaml wants {sub.name} {wanted[sub.name]}, the pinned module has {sub.chart_version} ({sub})")
        (out / "charts").mkdir(exist_ok=True)
        assemble(sub, out / "charts")
    return out


# --- values keys ------------------------------------------------------------------------------------

def _referenced(chart: pathlib.Path) -> set[str]:
    """Every ``.Values`` path a template of the chart (not of its subcharts) reads."""
    refs: set[str] = set()
    templates = chart / "templates"
    for f in templates.rglob("*") if templates.is_dir() else []:
        if f.is_file():
            text = f.read_text(errors="replace")
            refs |= {m.group(1).lstrip(".") for m in VALUES_REF.finditer(text)}
            refs |= {".".join(re.findall(r"\"([^\"]+)\"", m.group(1))) for m in INDEX_REF.finditer(text)}
    return refs


def _dependencies(chart: pathlib.Path) -> dict[str, pathlib.Path]:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    out = {}
    for dep in meta.get("dependencies") or []:
        out[dep.get("alias") or dep["name"]] = chart / "charts" / dep["name"]
    return out


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def unknown_keys(chart: pathlib.Path, values: dict, release: str) -> list[str]:
    """Our values' keys that the chart (or the subchart they are for) does not know, one line each."""
    if (chart / "values.schema.json").is_file():
        return []  # Helm validates against the schema, additionalProperties included
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    problems: list[str] = []
    subcharts = _dependencies(chart)
    refs = _referenced(chart)
    for key, value in values.items():
        if key in subcharts and isinstance(value, dict):
            sub = subcharts[key]
            if not sub.is_dir():
                continue  # a dependency not assembled: Helm refuses it if it stays enabled
            sub_defaults = yaml.safe_load((sub / "values.yaml").read_text()) or {}
            merged = _deep_merge(sub_defaults, defaults.get(key) or {})
            sub_refs = _referenced(sub) | {r.removeprefix(key + ".") for r in refs if r.startswith(key + ".")}
            _walk(value, merged, key, sub_refs, problems, release, chart.name + "/charts/" + sub.name, key)
        elif key != "global":
            _walk({key: value}, defaults, "", refs, problems, release, chart.name, "")
    return problems


def _walk(ours: dict, theirs, path: str, refs: set[str], problems: list[str], release: str, chart: str, prefix: str) -> None:
    for key, value in ours.items():
        sub = f"{path}.{key}" if path else key
        rel = sub.removeprefix(prefix + ".") if prefix else sub  # the path as the (sub)chart's templates read it
        if rel in refs:
            continue  # read whole by a template (toYaml, with: resources, affinity): any keys
        if isinstance(theirs, dict) and key in theirs:
            default = theirs[key]
            if isinstance(value, dict) and isinstance(default, dict) and default:
                _walk(value, default, sub, refs, problems, release, chart, prefix)
            continue
        if any(r.startswith(rel + ".") for r in refs):
            if isinstance(value, dict):
                _walk(value, {}, sub, refs, problems, release, chart, prefix)
            continue
        problems.append(f"release {release}: values key {sub} is unknown to chart {chart} (not in its values.yaml, read by no template)")


# --- rendering --------------------------------------------------------------------------------------

def helm_binary() -> pathlib.Path:
    unit = build.helm()
    build.build(unit)
    return unit.path("helm-template")


def kube_version(plan: StackPlan) -> str:
    """The Kubernetes version the chart sees: the local release of the stack's minor."""
    return versions.LOCAL_KUBERNETES_RELEASES.get(plan.kubernetes_version, f"v{plan.kubernetes_version}.0")


def template(release: Release, plan: StackPlan, *, api_versions: list[str] | None = None, values: dict | None = None) -> Rendered:
    """``release``'s chart rendered with the stack's values (or ``values``); ChartError on unknown
    keys or a chart Helm refuses. ``api_versions``: what the cluster serves beyond Kubernetes' own
    (``.Capabilities.APIVersions``; Helm asks the cluster on install)."""
    source = chart_source(release)
    if source is None:
        raise ChartError(f"release {release.name}: {not_rendered_reason(release)}")
    vals = release.values if values is None else values
    with tempfile.TemporaryDirectory(prefix="chart-") as tmp:
        chart = assemble(source, pathlib.Path(tmp))
        problems = unknown_keys(chart, vals, release.name)
        if problems:
            raise ChartError("\n".join(problems))
        req = {"chart": str(chart), "name": release.name, "namespace": release.namespace, "kubeVersion": kube_version(plan), "apiVersions": list(api_versions or []), "values": vals}
        proc = subprocess.run([str(helm_binary())], input=json.dumps(req), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ChartError(f"release {release.name}: Helm refuses chart {source.name} {source.chart_version} with the stack's values: {proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    if out["warnings"]:  # a value of ours Helm dropped while merging it into the chart's (a map for a scalar, ...)
        raise ChartError("\n".join(f"release {release.name}: Helm dropped a value of ours: {w}" for w in out["warnings"]))
    return Rendered(
        release=release,
        source=source,
        manifests=flattened([doc for m in out["manifests"] for doc in yaml.safe_load_all(m["content"]) if doc]),
        hooks=[{"events": h["events"], "weight": h["weight"], "object": doc} for h in out["hooks"] for doc in yaml.safe_load_all(h["content"]) if doc],
        crds=[doc for c in out["crds"] for doc in yaml.safe_load_all(c["content"]) if doc],
        notes=out["notes"],
    )


def not_rendered_reason(release: Release) -> str:
    return f"chart {release.chart} {release.version} ships in no Go module the local control plane builds"


def rendered(plan: StackPlan, *, api_versions: list[str] | None = None) -> list[Rendered]:
    """Every release of the stack whose chart can be rendered here; ChartError naming all problems."""
    out, problems = [], []
    for release in plan.releases:
        if chart_source(release) is None:
            continue
        try:
            out.append(template(release, plan, api_versions=api_versions))
        except ChartError as err:
            problems.append(str(err))
    if problems:
        raise ChartError("\n".join(problems))
    return out
