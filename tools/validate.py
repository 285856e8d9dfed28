"""Validate rendered Kubernetes objects offline.

Custom resources are checked against the upstream CRD schemas (``../shared/schemas`` beside the
project, or ``$CRD_SCHEMAS_DIR``), made strict: an object schema that lists its properties
rejects any other field, as the API server would silently prune it. Their CEL rules
(``x-kubernetes-validations``) are evaluated too, on a copy with the schema's defaults applied, with
the API server's (cel-go's) semantics (``tools.cel``); a rule that cannot be evaluated is a problem.
Built-in kinds are checked with ``kubernetes-validate`` in strict mode.

For a manifests directory, every TrainJob's ``runtimeRef`` must name a runtime rendered beside it.
With ``--previous DIR`` (an earlier render), the CRDs' transition rules (``oldSelf``, e.g. immutable
fields) are evaluated for every object present in both, as an update from the old object to the new.

The Trainer version (which CRD and JobSet schemas apply) is ``--trainer``, else the one the render
deploys (the kubeflow-trainer Helm release in ``plan.json`` beside the manifests directory), else the
default.

Usage: python -m tools.validate out/dev/manifests [--trainer v2.3.0] [--previous out/dev-old/manifests]
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import pathlib
import re
import sys
import time

import jsonschema
import yaml

import versions
from tools import cel

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent
KARPENTER_SCHEMA_VERSION = "v1.14.1"
KUEUE_SCHEMA_VERSION = "v0.19.2"
KUBERNETES_VALIDATE_VERSION = "1.34.0"
TRAINER_GROUP = "trainer.kubeflow.org"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"


def schemas_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CRD_SCHEMAS_DIR") or PROJECT_DIR.parent / "shared" / "schemas")


def schema_sets(trainer_version: str) -> list[str]:
    """Directories (relative to the schemas dir) that apply for a Trainer version."""
    jobset = versions.TRAINER_VERSIONS[trainer_version]["jobset"]
    return [f"kubeflow-trainer/{trainer_version}", f"jobset/{jobset}", f"karpenter/{KARPENTER_SCHEMA_VERSION}", f"kueue/{KUEUE_SCHEMA_VERSION}"]


def _strict(schema: dict) -> dict:
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


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


@functools.cache
def _strict_schema(path: pathlib.Path, api_version: str) -> dict:
    return _strict(_schemas(path)[api_version])


def _crd_path(sets: tuple[str, ...], api_version: str, kind: str) -> pathlib.Path | None:
    path = _crd_files(sets).get((api_version.split("/")[0], kind))
    return path if path is not None and api_version in _schemas(path) else None


@functools.cache
def _validator(path: pathlib.Path, api_version: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_strict_schema(path, api_version))


def crd_schema(api_version: str, kind: str, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> dict | None:
    """The strict JSON schema of a custom resource kind (None when no CRD of the Trainer version's sets has it)."""
    path = _crd_path(tuple(schema_sets(trainer_version)), api_version, kind)
    return _strict_schema(path, api_version) if path else None


def raw_crd_schema(api_version: str, kind: str, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> dict | None:
    """The CRD schema as published (defaults and CEL rules; not made strict)."""
    path = _crd_path(tuple(schema_sets(trainer_version)), api_version, kind)
    return _schemas(path)[api_version] if path else None


def jobset_schema(trainer_version: str) -> dict:
    """The JobSet spec schema bundled with a Trainer version (runtimes embed a JobSet template)."""
    schema = crd_schema("jobset.x-k8s.io/v1alpha2", "JobSet", trainer_version)
    if schema is None:
        raise LookupError(f"no JobSet CRD schema for Trainer {trainer_version} in {schemas_dir()}")
    return schema


def _label(obj: dict) -> str:
    return f"{obj.get('kind', '')}/{(obj.get('metadata') or {}).get('name')}"


def validate(obj: dict, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> list[str]:
    """Return a list of problems (empty when the object is valid): OpenAPI schema, then CEL rules."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    path = _crd_path(tuple(schema_sets(trainer_version)), api_version, kind)
    if path is not None:
        validator = _validator(path, api_version)
        problems = [f"{_label(obj)}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        return problems + cel_problems(obj, trainer_version)
    if "." in api_version.split("/")[0] and not api_version.startswith(("storage.k8s.io", "rbac.authorization.k8s.io", "scheduling.k8s.io", "networking.k8s.io")):
        return [f"{_label(obj)}: no CRD schema for {api_version} {kind} in {schemas_dir()}"]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VALIDATE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{_label(obj)}: {err.message}"]
    return []


def cel_problems(obj: dict, trainer_version: str = versions.DEFAULT_TRAINER_VERSION, old: dict | None = None) -> list[str]:
    """The CRD's CEL rules on a custom resource: on create, or with ``old`` the transition rules of an update."""
    schema = raw_crd_schema(obj.get("apiVersion", ""), obj.get("kind", ""), trainer_version)
    if schema is None:
        return []
    prefix = f"{_label(obj)}: " + ("update: " if old is not None else "")
    return [prefix + p for p in cel.rule_problems(obj, schema, old)]


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


def transition_problems(
    old_objects: list[dict], new_objects: list[dict], trainer_version: str = versions.DEFAULT_TRAINER_VERSION, replaced: dict | None = None
) -> list[str]:
    """Transition rules (``oldSelf``) for every object in both renders (same apiVersion, kind,
    namespace, name) that is updated in place. An object whose ``replaceOnChanges`` properties
    differ (``replaced``, from :func:`replaced_on_changes`) is deleted and created again: no
    transition applies to it."""
    old_by_key = {_key(o): o for o in old_objects}
    problems = []
    for obj in new_objects:
        old = old_by_key.get(_key(obj))
        if old is None:
            continue
        paths = (replaced or {}).get(_key(obj), [])
        if any(_at(old, p) != _at(obj, p) for p in paths):
            continue
        problems += cel_problems(obj, trainer_version, old=old)
    return problems


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


def validate_dir(manifests: pathlib.Path, trainer_version: str, previous: pathlib.Path | None = None) -> tuple[list[dict], list[str]]:
    """(objects, problems) for a rendered manifests directory."""
    objects = load_dir(manifests)
    problems = []
    for obj in objects:
        problems += validate(obj, trainer_version)
    problems += runtime_ref_problems(objects)
    if previous is not None:
        problems += transition_problems(load_dir(previous), objects, trainer_version, replaced_on_changes(manifests))
    return objects, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="validate rendered manifests")
    ap.add_argument("manifests")
    ap.add_argument("--trainer", choices=sorted(versions.TRAINER_VERSIONS), help="Trainer version whose CRDs apply (default: the one the render deploys)")
    ap.add_argument("--previous", metavar="DIR", help="an earlier render's manifests: check the CRDs' transition rules (oldSelf) from it")
    args = ap.parse_args(argv)
    if not schemas_dir().is_dir():
        print(f"validate: no CRD schemas at {schemas_dir()} (set CRD_SCHEMAS_DIR)", file=sys.stderr)
        return 2
    for d in filter(None, (args.manifests, args.previous)):
        if not pathlib.Path(d).is_dir():
            print(f"validate: {d} is not a directory", file=sys.stderr)
            return 2
    trainer = args.trainer
    if trainer is None:
        trainer, why = trainer_version_of(pathlib.Path(args.manifests))
        if trainer is None:
            trainer = versions.DEFAULT_TRAINER_VERSION
            print(f"validate: note: {why}; validating against Trainer {trainer} (the default; --trainer to choose)")
        else:
            print(f"validate: Trainer {trainer} (from {why})")
    started = time.perf_counter()
    objects, problems = validate_dir(pathlib.Path(args.manifests), trainer, pathlib.Path(args.previous) if args.previous else None)
    for p in problems:
        print(p)
    against = f", transition rules against {args.previous}" if args.previous else ""
    print(f"validate: {len(objects)} objects, {len(problems)} problems (Trainer {trainer}{against}; {time.perf_counter() - started:.2f}s)")
    judged = api_server_dry_run(pathlib.Path(args.manifests))
    return 1 if problems or judged else 0


def api_server_dry_run(manifests: pathlib.Path) -> list[str]:
    """With the stack's local control plane up (``make cluster-up``, state beside the manifests), the
    API server is the judge: every manifest server-side applied as a dry run (strict field
    validation, the served schemas and CEL rules, the admission webhooks and policies), and what it
    would store compared with what we sent. Without one, the offline checks above are all there is."""
    from tools.cluster import apply as cluster_apply
    from tools.cluster.client import ApiError, Client
    from tools.cluster.procs import Processes, alive

    state = Processes(manifests.parent / "cluster")
    server = state.info.get("server")
    apiserver = state.get("kube-apiserver")
    if not server or apiserver is None or not alive(apiserver):
        print("validate: no local control plane for this stack (make cluster-up): offline checks only")
        return []
    client = Client(server, manifests.parent / "cluster" / "pki")
    objs = [yaml.safe_load(f.read_text()) for f in sorted(manifests.glob("*.yaml"))]
    # namespaces first, as the dependency order applies them
    objs.sort(key=lambda o: o["kind"] != "Namespace")
    try:
        problems = [p for obj in objs for p in cluster_apply.dry_run(client, obj)]
    except ApiError as err:
        print(f"validate: the local API server at {server} did not answer: {err}")
        return [str(err)]
    for p in problems:
        print(f"api-server: {p}")
    print(f"validate: API server dry run at {server}: {len(objs)} objects, {len(problems)} problems")
    return problems


if __name__ == "__main__":
    sys.exit(main())
