"""Validate rendered Kubernetes objects: the API server is the judge.

``make validate`` brings up a bare API server (etcd and the kube-apiserver of the stack's
Kubernetes minor, with the CRDs of the pinned Trainer, JobSet, Kueue and Karpenter releases:
``tools/cluster/bare.py``), installs the render's namespaces and admission policies, and dry-runs
every object as a create: the served schemas with unknown fields refused, the CRDs' CEL rules,
defaults and the ValidatingAdmissionPolicies, judged by the API server itself. With
``--previous DIR`` (an earlier render) that render is stored first and every object is judged as
the update Pulumi would make (transition rules such as immutable fields); an object the program
replaces on change (``replaceOnChanges`` in ``plan.json``) is judged as its replacement's create.
Then the server is stopped.

What the API server cannot judge and is checked here: every TrainJob's ``runtimeRef`` names a
runtime rendered beside it (on a cluster the Trainer's webhook refuses the TrainJob otherwise; the
bare server runs no webhooks: ``make cluster-up`` runs them).

The Trainer version (which CRDs apply) is ``--trainer``, else the one the render deploys (the
kubeflow-trainer Helm release in ``plan.json``), else the default; the Kubernetes minor is the
stack's ``cluster.version`` (the EKS cluster in ``plan.json``), else the default.

Usage: python -m tools.validate out/dev/manifests [--trainer v2.3.0] [--previous out/dev-old/manifests]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import re
import sys
import time

import yaml

import versions

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent
KARPENTER_SCHEMA_VERSION = "v1.14.1"
KUEUE_SCHEMA_VERSION = "v0.19.2"
TRAINER_GROUP = "trainer.kubeflow.org"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


def schemas_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CRD_SCHEMAS_DIR") or PROJECT_DIR.parent / "shared" / "schemas")


def schema_sets(trainer_version: str) -> list[str]:
    """Directories (relative to the schemas dir) that apply for a Trainer version."""
    jobset = versions.TRAINER_VERSIONS[trainer_version]["jobset"]
    return [f"kubeflow-trainer/{trainer_version}", f"jobset/{jobset}", f"karpenter/{KARPENTER_SCHEMA_VERSION}", f"kueue/{KUEUE_SCHEMA_VERSION}"]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the CRD files are megabytes
_GROUP_RE = re.compile(r"^  group: (\S+)$", re.M)
_KIND_RE = re.compile(r"^  names:\n(?:    .*\n)*?    kind: (\S+)$", re.M)


@functools.cache
def _crd_files(sets: tuple[str, ...]) -> dict[tuple[str, str], pathlib.Path]:
    """(group, kind) -> CRD file, for every CRD in the given schema sets (read from each file's head)."""
    index = {}
    root = schemas_dir()
    for rel in sets:
        for path in sorted((root / rel).glob("*.yaml")):
            with path.open() as fh:
                head = fh.read(4096)
            group, kind = _GROUP_RE.search(head), _KIND_RE.search(head)
            if group and kind:
                index[(group.group(1), kind.group(1))] = path
            else:  # not in controller-gen's layout: read it all
                crd = _load_crd(path)
                index[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = path
    return index


@functools.cache
def _load_crd(path: pathlib.Path) -> dict:
    return yaml.load(path.read_text(), Loader=_LOADER)


@functools.cache
def _schemas(path: pathlib.Path) -> dict[str, dict]:
    """apiVersion -> openAPIV3Schema as published, for every version of a CRD file."""
    crd = _load_crd(path)
    return {f"{crd['spec']['group']}/{ver['name']}": ver["schema"]["openAPIV3Schema"] for ver in crd["spec"]["versions"]}


def _crd_path(sets: tuple[str, ...], api_version: str, kind: str) -> pathlib.Path | None:
    path = _crd_files(sets).get((api_version.split("/")[0], kind))
    return path if path is not None and api_version in _schemas(path) else None


def raw_crd_schema(api_version: str, kind: str, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> dict | None:
    """The CRD schema as published (defaults and CEL rules; not made strict)."""
    path = _crd_path(tuple(schema_sets(trainer_version)), api_version, kind)
    return _schemas(path)[api_version] if path else None


def _label(obj: dict) -> str:
    return f"{obj.get('kind', '')}/{(obj.get('metadata') or {}).get('name')}"


def _key(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def _at(obj: object, path: str) -> object:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def replaced_on_changes(manifests: pathlib.Path) -> dict[tuple[str, str, str, str], list[str]]:
    """Objects the program replaces (delete, then create) instead of updating when the given
    properties change: ``replaceOnChanges`` of the Kubernetes resources in ``plan.json``."""
    plan_path = pathlib.Path(manifests).parent / "plan.json"
    if not plan_path.is_file():
        return {}
    out = {}
    for r in json.loads(plan_path.read_text()).get("resources", []):
        inputs = r.get("inputs") or {}
        if r.get("replaceOnChanges") and str(r.get("type", "")).startswith("kubernetes:") and "kind" in inputs:
            out[_key(inputs)] = list(r["replaceOnChanges"])
    return out


def runtime_ref_problems(objects: list[dict]) -> list[str]:
    """Every TrainJob's runtimeRef must name a (Cluster)TrainingRuntime among the objects."""
    runtimes = {
        (o["kind"], (o["metadata"].get("namespace") or "") if o["kind"] == "TrainingRuntime" else "", o["metadata"].get("name"))
        for o in objects
        if o.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime") and o.get("apiVersion", "").startswith(TRAINER_GROUP + "/")
    }
    problems = []
    for job in objects:
        if job.get("kind") != "TrainJob" or not job.get("apiVersion", "").startswith(TRAINER_GROUP + "/"):
            continue
        ref = (job.get("spec") or {}).get("runtimeRef") or {}
        kind, group, name = ref.get("kind") or "ClusterTrainingRuntime", ref.get("apiGroup") or TRAINER_GROUP, ref.get("name")
        namespace = (job["metadata"].get("namespace") or "") if kind == "TrainingRuntime" else ""
        if group != TRAINER_GROUP or (kind, namespace, name) not in runtimes:
            where = f" in namespace {namespace!r}" if kind == "TrainingRuntime" else ""
            problems.append(f"{_label(job)}: spec.runtimeRef: {kind} {name!r} ({group}){where} is not among the rendered objects")
    return problems


def trainer_version_of(manifests: pathlib.Path) -> tuple[str | None, str]:
    """The Trainer version a render deploys, from the kubeflow-trainer Helm release in ``plan.json``
    beside the manifests directory; (None, why) when it can't be told."""
    plan_path = pathlib.Path(manifests).parent / "plan.json"
    if not plan_path.is_file():
        return None, f"no {plan_path}"
    try:
        plan = json.loads(plan_path.read_text())
    except (OSError, ValueError) as ex:
        return None, f"unreadable {plan_path}: {ex}"
    by_chart = {v["chart"]: k for k, v in versions.TRAINER_VERSIONS.items()}
    charts = [
        str((r.get("inputs") or {}).get("version"))
        for r in plan.get("resources", [])
        if r.get("type") == HELM_RELEASE and "kubeflow-trainer" in f"{r.get('name', '')} {(r.get('inputs') or {}).get('chart', '')}"
    ]
    if not charts:
        return None, f"no kubeflow-trainer Helm release in {plan_path}"
    known = sorted({by_chart[c] for c in charts if c in by_chart})
    if len(known) != 1 or len(set(charts)) != 1:
        return None, f"kubeflow-trainer chart version(s) {sorted(set(charts))} in {plan_path} do not map to one of {sorted(by_chart)}"
    return known[0], f"the kubeflow-trainer chart {charts[0]} in {plan_path}"


def load_dir(manifests: pathlib.Path) -> list[dict]:
    return [yaml.load(p.read_text(), Loader=_LOADER) for p in sorted(pathlib.Path(manifests).glob("*.yaml"))]


def validate(obj: dict, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> list[str]:
    """What the API server (a bare one with the Trainer version's CRDs, shared in this process)
    says of ``obj`` as a create: empty when it takes it whole."""
    from tools.cluster import bare

    return bare.judge_for(trainer_version).validate(obj)


def kubernetes_version_of(manifests: pathlib.Path) -> str:
    """The stack's Kubernetes minor (the EKS cluster's version in ``plan.json``), else the default."""
    plan_path = pathlib.Path(manifests).parent / "plan.json"
    if plan_path.is_file():
        for r in json.loads(plan_path.read_text()).get("resources", []):
            version = (r.get("inputs") or {}).get("version")
            if r.get("type") == "eks:index:Cluster" and version in versions.LOCAL_KUBERNETES_RELEASES:
                return str(version)
    return versions.DEFAULT_KUBERNETES_VERSION


def validate_dir(manifests: pathlib.Path, trainer_version: str, previous: pathlib.Path | None = None, *, echo=print, platform: pathlib.Path | None = None) -> tuple[list[dict], list[str]]:
    """(objects, problems) for a rendered manifests directory, judged by a bare API server started
    for it and stopped after. ``platform``: a TrainJob stack's platform render (its namespaces,
    policies and runtimes), stored first as the cluster the run is applied to."""
    from tools.cluster import bare

    objects = load_dir(manifests)
    around = load_dir(platform) if platform is not None else []
    minor = kubernetes_version_of(platform if platform is not None else manifests)
    shared = bare.running(trainer_version, minor)  # one started in this process (the tests'), reset after
    judge = shared or bare.Judge(kubernetes_version=minor, trainer_version=trainer_version, echo=echo).start()
    try:
        problems: list[str] = []
        replaced: dict = {}
        old_by_key: dict = {}
        if around:
            problems += [f"platform render: {p}" for p in judge.install(around)]
        if previous is not None:
            old = load_dir(previous)
            problems += [f"previous render: {p}" for p in judge.install(old)]
            old_by_key = {_key(o): o for o in old}
            replaced = replaced_on_changes(manifests)

        def is_replaced(obj: dict) -> bool:
            before = old_by_key.get(_key(obj))
            return before is not None and any(_at(before, p) != _at(obj, p) for p in replaced.get(_key(obj), []))

        first = [o for o in objects if o.get("kind") == "Namespace" or o.get("kind") in bare.POLICY_KINDS]
        for obj in first:  # judged, then stored: the policies judge what follows
            problems += judge.validate(obj, replaced=is_replaced(obj))
        judge.install(first)
        for obj in objects:
            if obj not in first:
                problems += judge.validate(obj, replaced=is_replaced(obj))
    finally:
        judge.reset() if shared else judge.stop()
    problems += runtime_ref_problems(objects + [o for o in around if o.get("kind") == "ClusterTrainingRuntime"])
    return objects, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="validate rendered manifests with a bare API server")
    ap.add_argument("manifests")
    ap.add_argument("--trainer", choices=sorted(versions.TRAINER_VERSIONS), help="Trainer version whose CRDs apply (default: the one the render deploys)")
    ap.add_argument("--previous", metavar="DIR", help="an earlier render's manifests: judge every object as the update from it")
    ap.add_argument("--platform", metavar="DIR", help="a TrainJob stack's platform render (out/workloads/<run>/platform/manifests): stored first; the Trainer version and minor are its")
    args = ap.parse_args(argv)
    for d in filter(None, (args.manifests, args.previous, args.platform)):
        if not pathlib.Path(d).is_dir():
            print(f"validate: {d} is not a directory", file=sys.stderr)
            return 2
    trainer = args.trainer
    if trainer is None:
        trainer, why = trainer_version_of(pathlib.Path(args.platform or args.manifests))
        if trainer is None:
            trainer = versions.DEFAULT_TRAINER_VERSION
            print(f"validate: note: {why}; validating against Trainer {trainer} (the default; --trainer to choose)")
        else:
            print(f"validate: Trainer {trainer} (from {why})")
    from tools.cluster.build import BuildError
    from tools.cluster.client import ApiError
    from tools.cluster.procs import ProcessError
    from tools.cluster.up import UpError

    started = time.perf_counter()
    try:
        objects, problems = validate_dir(pathlib.Path(args.manifests), trainer, pathlib.Path(args.previous) if args.previous else None, platform=pathlib.Path(args.platform) if args.platform else None)
    except (BuildError, ProcessError, ApiError, UpError) as err:
        print(f"validate: the API server could not be started: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    against = f", as updates from {args.previous}" if args.previous else ""
    print(f"validate: {len(objects)} objects judged by the API server, {len(problems)} problems (Trainer {trainer}{against}; {time.perf_counter() - started:.2f}s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
