"""Run a rendered TrainJob on this machine the way Kubeflow Trainer runs it on nodes.

The stack is rendered with the mock runtime; the TrainJob, its ClusterTrainingRuntime and its
code ConfigMap are read from the rendered manifests. Each node is one process group started
with the environment the Trainer injects (``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``) and the container command and
arguments exactly as rendered; mount paths are mapped to local directories (the ConfigMap's
files for the code volume, a persistent directory for the checkpoint claim). CPU and gloo, one
process per node, with the tiny profile appended to the arguments.

Like the JobSet failure policy of the runtime, a failed node fails the attempt: every node is
stopped and all are started again, up to ``maxRestarts``; exit codes the runtime declares
non-retryable fail the job at once. ``--fail-node N --fail-at-step K`` SIGKILLs node N's
processes once: the node's environment carries ``TRAINING_FAULT_AT_STEP=K`` on the first attempt, and
the training library kills the node's process group right after step K (exactly there, however
fast the steps run).

Usage: python -m tools.emulate --stack dev --job ddp [--fail-node 1 --fail-at-step 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from infra.stack_config import StackFileError
from k8s import trainer_api
from k8s.runtimes import NON_RETRYABLE_EXIT_CODES
from tools.mock_runtime import ProgramError, run_program
from tools.render import PROJECT_DIR, manifests
from workloads.trainjob import JOB_LABEL, TINY_PROFILE

FAULT_ENV = "TRAINING_FAULT_AT_STEP"  # read by workloads/programs/trainlib.py

EVENT = re.compile(r"^TRAINING_EVENT (\{.*\})$")


class EmulationError(Exception):
    pass


@dataclass
class Job:
    name: str
    kind: str
    num_nodes: int
    command: list[str]
    env: dict[str, str]
    max_restarts: int
    mounts: dict[str, str]  # container path -> local path


@dataclass
class Attempt:
    events: list[dict] = field(default_factory=list)
    exit_codes: dict[int, int] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_job(stack: str, kind: str, work_dir: str, stack_config: dict | None = None) -> Job:
    """Render the stack and turn the TrainJob for ``kind`` into a local Job."""
    try:
        run = run_program(PROJECT_DIR, stack, stack_config=stack_config)
    except (ProgramError, StackFileError, FileNotFoundError) as err:
        raise EmulationError(str(err)) from None
    objs = list(manifests(run).values())
    jobs = [o for o in objs if o["kind"] == "TrainJob" and o["metadata"].get("labels", {}).get(JOB_LABEL) == kind]
    if not jobs:
        raise EmulationError(f"stack {stack} renders no TrainJob for job {kind!r} (enable trainjobs.{kind}.enabled)")
    tj = jobs[0]
    spec = tj["spec"]
    runtime_name = spec["runtimeRef"]["name"]
    runtimes = [o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["name"] == runtime_name]
    if not runtimes:
        raise EmulationError(f"TrainJob {tj['metadata']['name']} references runtime {runtime_name}, which the stack does not render")
    runtime = runtimes[0]["spec"]
    max_restarts = runtime["template"]["spec"].get("failurePolicy", {}).get("maxRestarts", 0)
    node_job = next(j for j in runtime["template"]["spec"]["replicatedJobs"] if j["name"] == trainer_api.TRAINER_JOB)
    node_container = next(c for c in node_job["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == trainer_api.TRAINER_JOB)

    pod = trainer_api.read_pod_customization(spec)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    container = next((c for c in pod.get("containers", []) if c["name"] == trainer_api.TRAINER_JOB), {})
    mounts: dict[str, str] = {}
    for vm in container.get("volumeMounts", []):
        vol = volumes[vm["name"]]
        if "configMap" in vol:
            cm = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == vol["configMap"]["name"]]
            if not cm:
                raise EmulationError(f"ConfigMap {vol['configMap']['name']} is not rendered")
            local = os.path.join(work_dir, "configmaps", vol["configMap"]["name"])
            shutil.rmtree(local, ignore_errors=True)
            os.makedirs(local)
            for fname, text in cm[0].get("data", {}).items():
                with open(os.path.join(local, fname), "w") as fh:
                    fh.write(text)
        elif "persistentVolumeClaim" in vol:
            local = os.path.join(work_dir, "volumes", vol["persistentVolumeClaim"]["claimName"])
            os.makedirs(local, exist_ok=True)
        else:
            local = os.path.join(work_dir, "volumes", vm["name"])
            os.makedirs(local, exist_ok=True)
        mounts[vm["mountPath"]] = local

    def local_path(value: str) -> str:
        for path in sorted(mounts, key=len, reverse=True):
            if value == path or value.startswith(path + "/"):
                return mounts[path] + value[len(path) :]
        return value

    trainer = spec["trainer"]
    command = [local_path(a) for a in trainer.get("command", node_container.get("command", []))]
    args = [local_path(a) for a in trainer.get("args", node_container.get("args", []))]
    if command and command[0] in ("python", "python3"):
        command = [sys.executable] + command[1:]  # the image's interpreter is this one
    env = {e["name"]: local_path(e.get("value", "")) for e in node_container.get("env", []) + trainer.get("env", [])}
    return Job(
        name=tj["metadata"]["name"], kind=kind, num_nodes=int(trainer.get("numNodes", 1)), command=command + args + TINY_PROFILE[kind],
        env=env, max_restarts=int(max_restarts), mounts=mounts,
    )


def _node_env(job: Job, node: int, port: int, fault_step: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(FAULT_ENV, None)
    env.update(job.env)
    if fault_step is not None:
        env[FAULT_ENV] = str(fault_step)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchrun of this environment
    env.update(
        PET_NNODES=str(job.num_nodes), PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(node), PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port),
        CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
    )
    return env


def run_attempt(job: Job, attempt_no: int, fail: dict | None, timeout_s: float, quiet: bool) -> Attempt:
    """Start every node, watch rank 0's events, inject the failure, stop all on the first failure."""
    port = _free_port()
    inject = fail if fail is not None and not fail.get("done") else None  # the failure this attempt injects
    if inject is not None:
        inject["done"] = True  # once: later attempts run clean
        print(f"emulate: node {inject['node']} will be SIGKILLed at step {inject['step']}", flush=True)

    def fault_step(n: int) -> int | None:
        return inject["step"] if inject is not None and n == inject["node"] else None

    procs = [
        subprocess.Popen(job.command, env=_node_env(job, n, port, fault_step(n)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for n in range(job.num_nodes)
    ]
    result = Attempt()
    lock = threading.Lock()

    def kill(n: int) -> None:
        try:
            os.killpg(procs[n].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def pump(n: int) -> None:
        stdout = procs[n].stdout
        assert stdout is not None  # stdout=PIPE
        for line in stdout:
            line = line.rstrip("\n")
            m = EVENT.match(line)
            if m:
                ev = json.loads(m.group(1))
                with lock:
                    result.events.append(ev)
            if not quiet and not line.startswith(("W1", "I1", "[W")):
                print(f"[attempt {attempt_no} node {n}] {line}", flush=True)

    readers = [threading.Thread(target=pump, args=(n,), daemon=True) for n in range(job.num_nodes)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout_s
    while True:
        codes = {n: p.poll() for n, p in enumerate(procs)}
        failed = [n for n, c in codes.items() if c not in (None, 0)]
        if failed or all(c == 0 for c in codes.values()):
            break
        if time.monotonic() > deadline:
            print(f"emulate: attempt {attempt_no} timed out after {timeout_s:.0f}s", flush=True)
            failed = list(range(job.num_nodes))
            break
        time.sleep(0.1)
    if failed:  # like the JobSet: one failed node fails the attempt; the others are stopped
        for n in range(job.num_nodes):
            if procs[n].poll() is None:
                kill(n)
    for n, p in enumerate(procs):
        p.wait()
        result.exit_codes[n] = p.returncode
    for t in readers:
        t.join(timeout=5)
    return result


def emulate(job: Job, *, fail_node: int | None, fail_at_step: int | None, timeout_s: float = 900, quiet: bool = False) -> dict:
    if fail_node is not None and not 0 <= fail_node < job.num_nodes:
        raise EmulationError(f"--fail-node {fail_node} is not a node of the job (0..{job.num_nodes - 1})")
    fail = {"node": fail_node, "step": fail_at_step} if fail_node is not None and fail_at_step is not None else None
    restarts = 0
    while True:
        attempt = run_attempt(job, restarts, fail, timeout_s, quiet)
        codes = attempt.exit_codes
        if all(c == 0 for c in codes.values()):
            status = "Complete"
            break
        # torchrun reports a worker's exit code as its own; a non-retryable code fails the job
        if any(c in NON_RETRYABLE_EXIT_CODES for c in codes.values()):
            status = "Failed"
            print(f"emulate: non-retryable exit codes {codes}: failing without restart", flush=True)
            break
        if restarts >= job.max_restarts:
            status = "Failed"
            print(f"emulate: exit codes {codes}; maxRestarts ({job.max_restarts}) reached", flush=True)
            break
        restarts += 1
        print(f"emulate: exit codes {codes}; restarting all {job.num_nodes} nodes (restart {restarts}/{job.max_restarts})", flush=True)
    final = next((e for e in reversed(attempt.events) if e.get("event") == "result"), {})
    return {
        "job": job.name, "status": status, "nodes": job.num_nodes, "restarts": restarts,
        "resumed_from_step": final.get("resumed_from_step"), "final_step": final.get("final_step"), "final_loss": final.get("final_loss"),
        "result": final,
    }


def summary_line(r: dict) -> str:
    resumed = "none" if r["resumed_from_step"] is None else r["resumed_from_step"]
    return f"emulate: job={r['job']} status={r['status']} nodes={r['nodes']} restarts={r['restarts']} resumed_from_step={resumed} final_step={r['final_step']} final_loss={r['final_loss']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run a rendered TrainJob locally (CPU, gloo)")
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--job", choices=sorted(TINY_PROFILE), default="ddp")
    ap.add_argument("--fail-node", type=int)
    ap.add_argument("--fail-at-step", type=int)
    ap.add_argument("--work-dir", help="local volumes (default: a fresh temporary directory)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per attempt")
    ap.add_argument("--quiet", action="store_true", help="only events and the summary")
    args = ap.parse_args(argv)
    if (args.fail_node is None) != (args.fail_at_step is None):
        ap.error("--fail-node and --fail-at-step go together")
    work = args.work_dir or tempfile.mkdtemp(prefix=f"emulate-{args.stack}-{args.job}-")
    try:
        job = load_job(args.stack, args.job, work)
        print(f"emulate: {job.name}: {job.num_nodes} nodes, maxRestarts={job.max_restarts}, volumes: " + ", ".join(f"{k} -> {v}" for k, v in job.mounts.items()), flush=True)
        r = emulate(job, fail_node=args.fail_node, fail_at_step=args.fail_at_step, timeout_s=args.timeout, quiet=args.quiet)
    except EmulationError as err:
        print(f"emulate: {err}", file=sys.stderr)
        return 2
    print(summary_line(r), flush=True)
    return 0 if r["status"] == "Complete" else 1


if __name__ == "__main__":
    sys.exit(main())
