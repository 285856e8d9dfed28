"""A TrainJob stack (``workloads/``) on a local control plane: its platform stack first (the local
cluster of that stack, brought up and applied as ``make cluster-up STACK=<platform>`` does, or the
one already running under ``out/``), then the run rendered against the platform's outputs (its
StackReference) and applied as the second ``pulumi up`` would: only the run's objects, in the
engine's order. What the run's apply created is recorded, so a test can show it created nothing
of the platform.

Usage: python -m tools.cluster up --project workloads --stack fsdp   (make cluster-up PROJECT=workloads STACK=fsdp)
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

from tools import stack_refs
from tools.cluster.apply import Outcome, apply_waves, label
from tools.cluster.client import ApiError, Client
from tools.cluster.plan import StackPlan, _resource_name, waves
from tools.cluster.procs import Processes
from tools.cluster.up import PROJECT_DIR, Up, UpError, cluster_dir, up
from tools.mock_runtime import ProgramError, ProgramRun, run_program, stack_config_of
from tools.render import manifests

WORKLOADS_DIR = PROJECT_DIR / "workloads"
RUN_FILE = "run.json"  # beside the platform's cluster state: what each run's apply created


@dataclass
class RunUp:
    platform: Up
    run: ProgramRun
    objects: list[dict]  # the run's objects, in apply order
    created: list[str]  # the objects the run's apply created (did not exist before it)
    outcome: Outcome


def _exists(client: Client, obj: dict) -> bool:
    try:
        client.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        return True
    except ApiError as err:
        if err.status == 404:
            return False
        raise


def platform_of(run_stack: str) -> tuple[str, str, str]:
    """(the reference's name, the platform project's directory, the platform stack) of a run stack."""
    try:
        refs = stack_refs.referenced_stacks(stack_config_of(str(WORKLOADS_DIR), run_stack))
    except FileNotFoundError:
        raise UpError(f"no TrainJob stack {run_stack}: workloads/Pulumi.{run_stack}.yaml does not exist") from None
    if len(refs) != 1:
        raise UpError(f"TrainJob stack {run_stack} names {len(refs)} platform stacks of this repository; allowed: one")
    ((name, (project_dir, stack)),) = refs.items()
    return name, project_dir, stack


def up_run(run_stack: str, *, out: str | os.PathLike = "out", echo=print, platform_up: Up | None = None) -> RunUp:
    """The run of ``run_stack`` applied on its platform's local cluster (``platform_up``: that
    cluster, already up; else the one running under ``out``, else brought up now)."""
    name, project_dir, stack = platform_of(run_stack)
    if platform_up is None:
        d = cluster_dir(stack, out)
        running = Processes(d) if (d / "kubeconfig").exists() else None
        platform_up = up(stack, out=out, echo=echo) if running is None else _running(d, running)
    try:
        platform = run_program(project_dir, stack)
        run = run_program(str(WORKLOADS_DIR), run_stack, stack_outputs={name: platform.outputs})
    except ProgramError as err:
        raise UpError(f"rendering TrainJob stack {run_stack} failed: {' '.join(str(err).split())}") from None
    objs = manifests(run)
    ordered = [objs[_resource_name(reg) + ".yaml"] for wave in waves(run) for reg in wave]
    client = platform_up.client()
    before = {label(o) for o in ordered if _exists(client, o)}
    outcome = apply_waves(client, [[o] for o in ordered])
    created = [label(o) for o in ordered if label(o) not in before and _exists(client, o)]
    record = platform_up.dir / RUN_FILE
    runs = json.loads(record.read_text()) if record.exists() else {}
    runs[run_stack] = {"objects": [label(o) for o in ordered], "created": created, "problems": outcome.problems}
    record.write_text(json.dumps(runs, indent=2))
    echo(f"cluster: TrainJob stack {run_stack} applied on {stack}: {len(ordered)} objects ({', '.join(created) or 'none'} created), {len(outcome.problems)} problems")
    return RunUp(platform_up, run, ordered, created, outcome)


def _running(d: pathlib.Path, procs: Processes) -> Up:
    """The platform's local cluster that is already up (its processes checked alive)."""
    procs.check()
    plan = StackPlan(stack=procs.info.get("stack", ""), kubernetes_version="", trainer_version="", releases=[], node_groups=[], zones=[], access=[], waves=[])
    return Up(d, plan, procs.info["server"], d / "kubeconfig", Outcome(0, []), 0.0, 0.0)
