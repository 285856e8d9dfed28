"""Golden files of the rendered Kubernetes objects (tests/golden/<stack>/), so every change to
what the platform deploys shows up as a reviewable diff.

    python -m tools.golden            # check (what the test does)
    python -m tools.golden --update   # rewrite after an intended change
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

import yaml

from tools.mock_runtime import run_program
from tools.render import PROJECT_DIR, manifests

GOLDEN_DIR = pathlib.Path(PROJECT_DIR) / "tests" / "golden"
STACKS = ("dev", "prod")
_CODE_NAME = re.compile(r"training-code-[0-9a-f]{10}")
CODE_FILE = GOLDEN_DIR / "code.sha"
"""The programs' content hash, recorded apart: the objects and URNs above mask it (the programs
change often), but a new hash names a new code ConfigMap, and every enabled TrainJob of a deployed
stack is replaced on its next ``pulumi up`` (workloads/trainjobs.py), so a change must be seen."""


def code_digest() -> str:
    from workloads.builders.trainjobs import code_files, code_hash

    return code_hash(code_files())[:10]


def code_diff() -> list[str]:
    want = CODE_FILE.read_text().strip() if CODE_FILE.exists() else ""
    got = code_digest()
    if want == got:
        return []
    return [f"the training programs changed (code {want or 'unrecorded'} -> {got}): every enabled TrainJob of a deployed stack is replaced on its next pulumi up; review, then make golden"]


def normalized(obj: dict) -> str:
    """YAML text with the code ConfigMap's content hash masked (the programs change often)."""
    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith("training-code-"):
        obj = {**obj, "data": {k: "<program source>" for k in obj.get("data", {})}, "metadata": {**obj["metadata"], "annotations": {}}}
    return _CODE_NAME.sub("training-code-<sha>", yaml.safe_dump(obj, sort_keys=False))


def rendered(stack: str) -> dict[str, str]:
    run = run_program(PROJECT_DIR, stack)
    return {_CODE_NAME.sub("training-code-sha", name): normalized(obj) for name, obj in manifests(run).items()}


def urns(stack: str) -> str:
    """Every resource's URN, one a line, sorted: a refactor must leave them as they are (a changed
    URN is a replaced resource unless an alias carries it over)."""
    run = run_program(PROJECT_DIR, stack)
    return "".join(f"{u}\n" for u in sorted({_CODE_NAME.sub("training-code-sha", r.urn) for r in run.registrations}))


def urn_file(stack: str) -> pathlib.Path:
    return GOLDEN_DIR / f"{stack}.urns"


def diff(stack: str) -> list[str]:
    want_dir = GOLDEN_DIR / stack
    got = rendered(stack)
    want = {p.name: p.read_text() for p in want_dir.glob("*.yaml")} if want_dir.is_dir() else {}
    problems = [f"{stack}: {n} is new" for n in sorted(set(got) - set(want))]
    problems += [f"{stack}: {n} is no longer rendered" for n in sorted(set(want) - set(got))]
    problems += [f"{stack}: {n} changed" for n in sorted(set(got) & set(want)) if got[n] != want[n]]
    return problems


def urn_diff(stack: str) -> list[str]:
    want = set(urn_file(stack).read_text().splitlines()) if urn_file(stack).exists() else set()
    got = set(urns(stack).splitlines())
    # a new URN is a new resource (review it with `make golden`); a gone one would be replaced or deleted
    return [f"{stack}: URN gone (the resource would be replaced or deleted) {u}" for u in sorted(want - got)]


def update(stack: str) -> None:
    out = GOLDEN_DIR / stack
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.yaml"):
        old.unlink()
    for name, text in rendered(stack).items():
        (out / name).write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--update", action="store_true")
    args = ap.parse_args(argv)
    problems = [] if args.update else code_diff()
    if args.update:
        CODE_FILE.write_text(code_digest() + "\n")
    for stack in STACKS:
        if args.update:
            update(stack)
            urn_file(stack).write_text(urns(stack))
        else:
            problems += diff(stack) + urn_diff(stack)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
