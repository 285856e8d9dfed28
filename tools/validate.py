"""Validate rendered Kubernetes objects offline.

Custom resources are checked against the upstream CRD schemas (``../shared/schemas`` beside the
project, or ``$CRD_SCHEMAS_DIR``), made strict: an object schema that lists its properties
rejects any other field, as the API server would silently prune it. Built-in kinds are checked
with ``kubernetes-validate`` in strict mode. CEL rules are not evaluated.

Usage: python -m tools.validate out/dev/manifests [--trainer v2.3.0]
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import pathlib
import sys

import jsonschema
import yaml

import versions

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent
KARPENTER_SCHEMA_VERSION = "v1.14.1"
KUBERNETES_VALIDATE_VERSION = "1.34.0"


def schemas_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CRD_SCHEMAS_DIR") or PROJECT_DIR.parent / "shared" / "schemas")


def schema_sets(trainer_version: str) -> list[str]:
    """Directories (relative to the schemas dir) that apply for a Trainer version."""
    jobset = versions.TRAINER_VERSIONS[trainer_version]["jobset"]
    return [f"kubeflow-trainer/{trainer_version}", f"jobset/{jobset}", f"karpenter/{KARPENTER_SCHEMA_VERSION}"]


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


@functools.cache
def _crd_index(sets: tuple[str, ...]) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> strict JSON schema, for every CRD in the given schema sets."""
    index = {}
    root = schemas_dir()
    for rel in sets:
        for path in sorted((root / rel).glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for ver in crd["spec"]["versions"]:
                schema = ver["schema"]["openAPIV3Schema"]
                index[(f"{group}/{ver['name']}", kind)] = _strict(schema)
    return index


def crd_schema(api_version: str, kind: str, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> dict | None:
    return _crd_index(tuple(schema_sets(trainer_version))).get((api_version, kind))


def jobset_schema(trainer_version: str) -> dict:
    """The JobSet spec schema bundled with a Trainer version (runtimes embed a JobSet template)."""
    return crd_schema("jobset.x-k8s.io/v1alpha2", "JobSet", trainer_version)


def validate(obj: dict, trainer_version: str = versions.DEFAULT_TRAINER_VERSION) -> list[str]:
    """Return a list of problems (empty when the object is valid)."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    schema = crd_schema(api_version, kind, trainer_version)
    if schema is not None:
        validator = jsonschema.Draft7Validator(schema)
        return [f"{kind}/{obj['metadata'].get('name')}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    if "." in api_version.split("/")[0] and not api_version.startswith(("storage.k8s.io", "rbac.authorization.k8s.io", "scheduling.k8s.io")):
        return [f"{kind}/{obj['metadata'].get('name')}: no CRD schema for {api_version} {kind} in {schemas_dir()}"]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VALIDATE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{kind}/{obj['metadata'].get('name')}: {err.message}"]
    return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="validate rendered manifests")
    ap.add_argument("manifests")
    ap.add_argument("--trainer", default=versions.DEFAULT_TRAINER_VERSION)
    args = ap.parse_args(argv)
    if not schemas_dir().is_dir():
        print(f"validate: no CRD schemas at {schemas_dir()} (set CRD_SCHEMAS_DIR)", file=sys.stderr)
        return 2
    problems = []
    files = sorted(pathlib.Path(args.manifests).glob("*.yaml"))
    for path in files:
        problems += validate(yaml.safe_load(path.read_text()), args.trainer)
    for p in problems:
        print(p)
    print(f"validate: {len(files)} objects, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
