"""Offline render: run the program for a stack under the mock runtime and write
``out/<stack>/plan.json`` and one YAML file per Kubernetes object in ``out/<stack>/manifests``.

Usage: python -m tools.render --stack dev [--out out] [--project-dir DIR]
       python -m tools.render --project workloads --stack fsdp   # a TrainJob stack: out/workloads/fsdp/

A TrainJob stack (``workloads/``) is rendered after the platform stack it names, which is rendered
first: the run's StackReference answers with that render's outputs, and the platform's render is
written beside the run's as ``out/workloads/<run>/platform/`` (plan.json, manifests/: what
``make validate`` and ``make cluster-up`` put on the API server before the run).

A stack file that is not valid, or a program that fails, prints one line
(``render: <stack>: <message>``), exits 2 and leaves no render of it behind (a local cluster's
state in ``out/<stack>/cluster`` is kept).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import shutil
import sys

import yaml

from config.stack_file import StackFileError
from k8s.resources import resource_name
from tools import stack_refs
from tools.mock_runtime import ProgramError, ProgramRun, run_program, stack_config_of

PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_MANIFESTS = ("pulumi:providers:", "kubernetes:helm.sh/")
WORKLOADS = "workloads"  # the TrainJob stacks' project (workloads/Pulumi.yaml)
PLATFORM_DIR = "platform"  # beside a TrainJob stack's render: the platform stack's, rendered first


def manifests(run: ProgramRun) -> dict[str, dict]:
    """File name -> Kubernetes object for every object the program declares directly."""
    out = {}
    for reg in run.registrations:
        if not reg.custom or not reg.type.startswith("kubernetes:") or reg.type.startswith(NOT_MANIFESTS):
            continue
        obj = _canonical({k: v for k, v in reg.inputs.items() if not k.startswith("__")})
        out[resource_name(obj) + ".yaml"] = obj
    return out


_HEAD = ("apiVersion", "kind", "metadata")


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _canonical(obj: dict) -> dict:
    """apiVersion, kind, metadata first, then the rest; nested keys sorted (stable diffs)."""
    head = {k: _sorted(obj[k]) for k in _HEAD if k in obj}
    return {**head, **{k: _sorted(obj[k]) for k in sorted(obj) if k not in _HEAD}}


KEEP = ("cluster",)  # a running local cluster's state (tools/cluster) outlives renders


def clear(stack_dir: str) -> None:
    """Remove an earlier render of the stack (all but a local cluster's state)."""
    if not os.path.isdir(stack_dir):
        return
    for entry in os.listdir(stack_dir):
        if entry in KEEP:
            continue
        path = os.path.join(stack_dir, entry)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    if not os.listdir(stack_dir):
        os.rmdir(stack_dir)


def write(run: ProgramRun, out_dir: str, *, stack_dir: str | None = None) -> dict[str, dict]:
    stack_dir = stack_dir or os.path.join(out_dir, run.stack)
    clear(stack_dir)
    os.makedirs(os.path.join(stack_dir, "manifests"))
    with open(os.path.join(stack_dir, "plan.json"), "w") as fh:
        json.dump(run.plan(), fh, indent=2, sort_keys=False)
        fh.write("\n")
    objs = manifests(run)
    for fname, obj in objs.items():
        with open(os.path.join(stack_dir, "manifests", fname), "w") as fh:
            yaml.safe_dump(obj, fh, sort_keys=False)
    return objs


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--out", default=os.path.join(PROJECT_DIR, "out"))
    ap.add_argument("--project-dir", default=PROJECT_DIR, help="the Pulumi project (Pulumi.yaml, Pulumi.<stack>.yaml, __main__.py); default: this repository")
    ap.add_argument("--project", choices=("", WORKLOADS), default="", help=f"{WORKLOADS}: a TrainJob stack of {WORKLOADS}/ (out/{WORKLOADS}/<stack>/), after its platform stack")
    args = ap.parse_args(argv)
    if args.project:
        args.project_dir, args.out = os.path.join(PROJECT_DIR, args.project), os.path.join(args.out, args.project)
    elif args.stack == WORKLOADS:  # its render would clear the TrainJob stacks' renders (out/workloads/)
        print(f"render: {args.stack}: a platform stack named {WORKLOADS} would share out/{WORKLOADS}/ with the TrainJob stacks; rename the stack", file=sys.stderr)
        return 2
    # nothing stale may pass for this render's output, whatever happens next
    clear(os.path.join(args.out, args.stack))
    collect = _Collect()
    logging.getLogger().addHandler(collect)
    platforms: dict[str, ProgramRun] = {}
    try:
        if args.project:  # the platform stacks it references, rendered first
            platforms = {name: run_program(d, stack) for name, (d, stack) in stack_refs.referenced_stacks(stack_config_of(args.project_dir, args.stack)).items()}
        run = run_program(args.project_dir, args.stack, stack_outputs={name: r.outputs for name, r in platforms.items()} if args.project else None)
    except (StackFileError, ProgramError, FileNotFoundError) as err:  # one line, no traceback, nothing written
        # one line per problem (a config error lists every invalid key), each line whole
        lines = [" ".join(line.split()) for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        for line in lines:
            print(f"render: {args.stack}: {line}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger().removeHandler(collect)
    objs = write(run, args.out)
    for name, platform in platforms.items():
        write(platform, args.out, stack_dir=os.path.join(args.out, args.stack, PLATFORM_DIR))
        print(f"render: platform stack {name} rendered first -> {os.path.join(args.out, args.stack, PLATFORM_DIR)}")
    counts = collections.Counter(r.type for r in run.registrations)
    print(f"render: stack={args.stack} resources={len(run.registrations)} manifests={len(objs)} -> {os.path.join(args.out, args.stack)}")
    for typ, n in sorted(counts.items()):
        print(f"  {n:4d}  {typ}")
    for msg in collect.messages:
        print(f"warning: {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
