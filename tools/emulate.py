"""Run a rendered TrainJob on this machine the way Kubeflow Trainer runs it on nodes.

The stack is rendered with the mock runtime; the TrainJob, its ClusterTrainingRuntime and its
code ConfigMap are read from the rendered manifests. Each node is one process group started
with the environment the Trainer injects (``PET_NNODES``, ``PET_NPROC_PER_NODE`` from the
TrainJob's ``trainer.numProcPerNode``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
``PET_MASTER_PORT``) and the container command and arguments exactly as rendered; mount paths
are mapped to local directories (the ConfigMap's files for the code volume, a persistent
directory for the checkpoint claim). CPU and gloo, with the tiny profile appended to the
arguments. Replicated jobs that ``node`` ``dependsOn`` (initializers) run to completion first.

Failures are handled as Kubernetes and JobSet would, from the rendered runtime: a failed pod
is matched against the Job's ``podFailurePolicy`` (a ``FailJob`` rule fails the Job with reason
``PodFailurePolicy`` and Kubernetes' message, e.g. ``Container node for pod training/x failed
with exit code 3 matching FailJob rule at index 0``; otherwise ``backoffLimit: 0`` fails it
with ``BackoffLimitExceeded``), and the failed Job against the JobSet ``failurePolicy`` rules
(``onJobFailureReasons``, ``onJobFailureMessagePatterns`` as regular expressions,
``targetReplicatedJobs``): ``FailJobSet`` ends the job as Failed at once, ``RestartJobSet`` (also
the default) restarts every node up to ``maxRestarts``, ``RestartJobSetAndIgnoreMaxRestarts``
restarts without counting. ``--fail-node N --fail-at-step K`` SIGKILLs node N's processes once:
the node's environment carries ``TRAINING_FAULT_AT_STEP=K`` on the first attempt, and the
training library kills the node's process group right after step K (exactly there, however
fast the steps run). Temporary directories (the default work directory, each pod's ``TMPDIR``)
are removed at the end.

The image's ``python``/``python3`` is this interpreter, or ``--python``: the TensorFlow job
(``--job tf``) runs with the TensorFlow virtualenv ``.venv-tf`` that ``make emulate JOB=tf``
creates from workloads/requirements-tf.txt. Its runtime's wrapper command (TF_CONFIG from the
injected ``PET_*``) runs as rendered; every node is on this host, so the wrapper gives each
TensorFlow worker its own port from ``TF_PORT``. The summary line of the all-reduce check
(``--job nccl-check``) adds the bus bandwidth it measured (``busbw_gbps``).

``--trainjob FILE`` runs the TrainJob that ``trainctl submit --dry-run`` printed (its code
ConfigMap and TrainJob) on the runtime the stack renders, with the user's command as is.

Usage: python -m tools.emulate --stack dev --job ddp [--fail-node 1 --fail-at-step 5]
       python -m tools.emulate --trainjob job.yaml [--stack dev]
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator

from manifests import trainer_api
from manifests.trainjobs import TINY_PROFILE
from tools.emulator_objects import (  # noqa: F401
    BACKOFF_LIMIT_EXCEEDED,
    DEADLINE_EXCEEDED,
    EVENT,
    FAIL_JOBSET,
    FAILED_JOBS,
    FAULT_ENV,
    JOBSET_ACTIONS,
    POD_FAILURE_ACTIONS,
    POD_FAILURE_POLICY,
    REACHED_MAX_RESTARTS,
    TF_VENV,
    Attempt,
    EmulationError,
    InitJob,
    Job,
    PodExit,
    _check_policies,
    _free_port,
    _last_int,
    _nproc_per_node,
    _trainer_initializer,
    _volume_dir,
    default_python,
    job_from_objects,
    load_job,
    load_trainjob_file,
    max_steps,
    sized_profile,
    write_configmap,
)

# --- failure policies --------------------------------------------------------------------------


def _rule_matches_pod(rule: dict, container: str, pod: PodExit) -> str | None:
    """Kubernetes' message when a podFailurePolicy rule matches the failed pod, else None."""
    on_codes = rule.get("onExitCodes")
    if on_codes is not None:
        if on_codes.get("containerName") not in (None, container) or pod.exit_code == 0:
            return None
        inside = pod.exit_code in on_codes.get("values", [])
        if inside == (on_codes.get("operator", "In") == "In"):
            return f"Container {container} for pod {{pod}} failed with exit code {pod.exit_code} matching {rule['action']} rule at index {{index}}"
        return None
    for cond in rule.get("onPodConditions", []):
        if any(c.get("type") == cond["type"] and c.get("status", "True") == cond.get("status", "True") for c in pod.conditions):
            return f"Pod {{pod}} has condition {cond['type']} matching {rule['action']} rule at index {{index}}"
    return None


def job_failure(pod_failure_policy: dict, container: str, namespace: str, failed: list[PodExit]) -> tuple[str, str]:
    """(reason, message) of a Job with ``backoffLimit: 0`` whose pods ``failed``, as the Job
    controller sets them: the first rule that matches a pod decides; FailJob fails the Job with
    reason PodFailurePolicy, Count (or no rule) counts the failure, which exceeds the backoff limit."""
    for pod in failed:
        for index, rule in enumerate(pod_failure_policy.get("rules", [])):
            message = _rule_matches_pod(rule, container, pod)
            if message is None:
                continue
            if rule["action"] == "FailJob":
                return POD_FAILURE_POLICY, message.format(pod=f"{namespace}/{pod.pod}", index=index)
            break  # Count: an ordinary failure
    return BACKOFF_LIMIT_EXCEEDED


def jobset_rule(failure_policy: dict | None, replicated_job: str, reason: str, message: str) -> dict | None:
    """The first JobSet failurePolicy rule that applies to a failed Job, else None."""
    for rule in (failure_policy or {}).get("rules", []):
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        if rule.get("targetReplicatedJobs") and replicated_job not in rule["targetReplicatedJobs"]:
            continue
        return rule
    return None


# --- processes ---------------------------------------------------------------------------------


def _pod_env(job: Job, extra: dict[str, str], tmp: str, fault_step: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(FAULT_ENV, None)
    env.update(extra)
    if fault_step is not None:
        env[FAULT_ENV] = str(fault_step)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchrun of this environment
    os.makedirs(tmp, exist_ok=True)
    env.update(TMPDIR=tmp, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports that are free now."""
    for _ in range(50):
        base = _free_port()
        if base + n > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for p in range(base, base + n):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
        return base
    raise EmulationError(f"no {n} consecutive free ports")


def _node_env(job: Job, node: int, port: int, fault_step: int | None, tmp: str, tf_port: int) -> dict[str, str]:
    env = _pod_env(job, job.env, tmp, fault_step)
    env.update(
        PET_NNODES=str(job.num_nodes), PET_NPROC_PER_NODE=str(job.nproc_per_node), PET_NODE_RANK=str(node),
        PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port),
        TF_PORT=str(tf_port),  # the TF_CONFIG wrapper (incluster/tf_config.py): worker i listens on TF_PORT + i here
    )
    return env


def _container_exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode  # killed by signal N: 128 + N


def _run_pods(commands: list[tuple[list[str], dict[str, str]]], pod_names: list[str], label: str, timeout_s: float, quiet: bool) -> Attempt:
    """Start every pod, stop them all on the first failure (a distributed job needs every one)."""
    result = Attempt()
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []

    def kill(p: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)

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
                print(f"[{label} {n}] {line}", flush=True)

    readers: list[threading.Thread] = []
    try:
        for command, env in commands:
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        readers = [threading.Thread(target=pump, args=(n,), daemon=True) for n in range(len(procs))]
        for t in readers:
            t.start()
        deadline = time.monotonic() + timeout_s
        while True:
            codes = {n: p.poll() for n, p in enumerate(procs)}
            failed = {n: c for n, c in codes.items() if c not in (None, 0)}
            if failed or all(c == 0 for c in codes.values()):
                break
            if time.monotonic() > deadline:
                print(f"emulate: {label} timed out after {timeout_s:.0f}s", flush=True)
                result.timed_out = True
                break
            time.sleep(0.1)
        result.failed = [PodExit(pod_names[n], _container_exit_code(c)) for n, c in sorted(failed.items())]
    finally:  # like the JobSet: one failed pod fails the attempt; the others are stopped (also on errors here)
        for p in procs:
            if p.poll() is None:
                kill(p)
        for n, p in enumerate(procs):
            p.wait()
            result.exit_codes[n] = _container_exit_code(p.returncode)
        for t in readers:
            t.join(timeout=5)
        for p in procs:
            if p.stdout is not None:
                p.stdout.close()
    return result


def run_attempt(job: Job, attempt_no: int, fail: dict | None, timeout_s: float, quiet: bool, tmp_root: str) -> Attempt:
    """Run the initializers, then every node; watch rank 0's events and inject the failure."""
    tmp = os.path.join(tmp_root, f"attempt-{attempt_no}")
    for init in job.init_jobs:
        names = [f"{job.name}-{init.name}-0-{i}" for i in range(init.replicas)]
        cmds = [(init.command, _pod_env(job, init.env, os.path.join(tmp, init.name, str(i)), None)) for i in range(init.replicas)]
        result = _run_pods(cmds, names, f"attempt {attempt_no} {init.name}", timeout_s, quiet)
        if result.failed or result.timed_out:
            result.failed_job = init.name
            return result
    port, tf_port = _free_port(), _free_ports(job.num_nodes)
    inject = fail if fail is not None and not fail.get("done") else None  # the failure this attempt injects
    if inject is not None:
        inject["done"] = True  # once: later attempts run clean
        print(f"emulate: node {inject['node']} will be SIGKILLed at step {inject['step']}", flush=True)

    def fault_step(n: int) -> int | None:
        return inject["step"] if inject is not None and n == inject["node"] else None

    names = [f"{job.name}-{trainer_api.TRAINER_JOB}-0-{n}" for n in range(job.num_nodes)]
    cmds = [(job.command, _node_env(job, n, port, fault_step(n), os.path.join(tmp, f"node-{n}"), tf_port)) for n in range(job.num_nodes)]
    return _run_pods(cmds, names, f"attempt {attempt_no} node", timeout_s, quiet)


@contextlib.contextmanager
def _temp_root(prefix: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_fault(job: Job, fail_node: int | None, fail_at_step: int | None) -> None:
    if fail_node is not None and not 0 <= fail_node < job.num_nodes:
        raise EmulationError(f"--fail-node {fail_node} is not a node of the job (0..{job.num_nodes - 1})")
    if fail_at_step is not None:
        check_fail_step(fail_at_step, job.last_step)


def check_fail_step(step: int, last_step: int | None) -> None:
    if step < 1:
        raise EmulationError(f"--fail-at-step {step}: steps start at 1")
    if last_step is not None and step > last_step:
        raise EmulationError(f"--fail-at-step {step} is beyond the last step of the run ({last_step}, the tiny profile's --max-steps)")


def emulate(job: Job, *, fail_node: int | None, fail_at_step: int | None, timeout_s: float = 900, quiet: bool = False) -> dict:
    check_fault(job, fail_node, fail_at_step)
    fail = {"node": fail_node, "step": fail_at_step} if fail_node is not None and fail_at_step is not None else None
    restarts = counted = 0
    reason = message = None
    failed_job = ""
    with _temp_root(f"emulate-{job.name}-") as tmp_root:
        while True:
            attempt = run_attempt(job, restarts, fail, timeout_s, quiet, tmp_root)
            if not attempt.failed and not attempt.timed_out:
                status = "Complete"
                break
            init = next((i for i in job.init_jobs if i.name == attempt.failed_job), None)
            pfp, container = (init.pod_failure_policy, init.container) if init else (job.pod_failure_policy, trainer_api.TRAINER_JOB)
            job_reason, job_message = DEADLINE_EXCEEDED if attempt.timed_out else job_failure(pfp, container, job.namespace, attempt.failed)
            failed_job = f"{job.name}-{attempt.failed_job}-0"
            codes = {p.pod: p.exit_code for p in attempt.failed}
            print(f"emulate: Job {failed_job} failed ({job_reason}: {job_message}); exit codes {codes}", flush=True)
            if job.failure_policy is None:
                status, (reason, message) = "Failed", FAILED_JOBS
                break
            rule = jobset_rule(job.failure_policy, attempt.failed_job, job_reason, job_message)
            action = rule["action"] if rule else "RestartJobSet"
            named = f" (rule {rule.get('name')})" if rule else ""
            if action == "FailJobSet":
                status, (reason, message) = "Failed", FAIL_JOBSET
                message += named
                break
            if action == "RestartJobSet":
                if counted >= job.max_restarts:
                    status, (reason, message) = "Failed", REACHED_MAX_RESTARTS
                    message += f" ({job.max_restarts})"
                    break
                counted += 1
            restarts += 1
            print(f"emulate: {action}{named}: restarting all {job.num_nodes} nodes (restart {restarts}, {counted}/{job.max_restarts} counted)", flush=True)
    if reason is not None:
        message = f"{message} (first failed job: {failed_job})"
        print(f"emulate: JobSet failed: {reason}: {message}", flush=True)
    final = next((e for e in reversed(attempt.events) if e.get("event") == "result"), {})
    return {
        "job": job.name, "status": status, "nodes": job.num_nodes, "world_size": job.world_size, "restarts": restarts,
        "resumed_from_step": final.get("resumed_from_step"), "final_step": final.get("final_step"), "final_loss": final.get("final_loss"),
        "busbw_gbps": final.get("busbw_gbps"), "reason": reason, "message": message, "result": final,
    }


def summary_line(r: dict) -> str:
    resumed = "none" if r["resumed_from_step"] is None else r["resumed_from_step"]
    line = (
        f"emulate: job={r['job']} status={r['status']} nodes={r['nodes']} world_size={r['world_size']} restarts={r['restarts']} "
        f"resumed_from_step={resumed} final_step={r['final_step']} final_loss={r['final_loss']}"
    )
    if r.get("busbw_gbps") is not None:  # the all-reduce check's figure
        line += f" busbw_gbps={r['busbw_gbps']}"
    return line + (f" reason={r['reason']}" if r.get("reason") else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run a rendered TrainJob locally (CPU, gloo)")
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--job", choices=sorted(TINY_PROFILE), default="ddp")
    ap.add_argument("--fail-node", type=int)
    ap.add_argument("--fail-at-step", type=int)
    ap.add_argument("--work-dir", help="local volumes, kept (default: a temporary directory, removed at the end)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per attempt")
    ap.add_argument("--quiet", action="store_true", help="only events and the summary")
    ap.add_argument("--python", help=f"interpreter for the image's python3 (default: this one; --job tf: {TF_VENV}/bin/python)")
    ap.add_argument("--trainjob", metavar="FILE", help="run the TrainJob of this file (trainctl submit --dry-run output) on the stack's runtime, instead of --job")
    ap.add_argument("--hub-dir", help="local hub (datasets/<owner>/<name>, models/<owner>/<name>) the emulated initializers read; default: tiny fixtures in the work directory")
    args = ap.parse_args(argv)
    if (args.fail_node is None) != (args.fail_at_step is None):
        ap.error("--fail-node and --fail-at-step go together")
    try:
        if args.fail_at_step is not None:  # before rendering or starting anything
            check_fail_step(args.fail_at_step, None if args.trainjob else max_steps(TINY_PROFILE[args.job]))
        with contextlib.ExitStack() as stack:
            work = args.work_dir or stack.enter_context(_temp_root(f"emulate-{args.stack}-{'trainjob' if args.trainjob else args.job}-"))
            if args.trainjob:
                job = load_trainjob_file(args.trainjob, args.stack, work, python=args.python)
            else:
                job = load_job(args.stack, args.job, work, python=args.python, hub_dir=args.hub_dir)
            for init in job.init_jobs:
                print(f"emulate: {init.name} first ({init.env.get(trainer_api.STORAGE_URI_ENV, 'no ' + trainer_api.STORAGE_URI_ENV)})", flush=True)
            print(
                f"emulate: {job.name}: {job.num_nodes} nodes x {job.nproc_per_node} processes, maxRestarts={job.max_restarts}, volumes: "
                + ", ".join(f"{k} -> {v}" for k, v in job.mounts.items()), flush=True,
            )
            r = emulate(job, fail_node=args.fail_node, fail_at_step=args.fail_at_step, timeout_s=args.timeout, quiet=args.quiet)
    except EmulationError as err:
        print(f"emulate: {err}", file=sys.stderr)
        return 2
    print(summary_line(r), flush=True)
    return 0 if r["status"] == "Complete" else 1

if __name__ == "__main__":
    sys.exit(main())
