"""Run a rendered TrainJob on this machine the way Kubeflow Trainer runs it on nodes.

The stack is rendered with the mock runtime; the TrainJob, its ClusterTrainingRuntime and its
code ConfigMap are read from the rendered manifests. Each node is started as the first process
of a PID namespace of its own where the machine allows it, as in its container (tools/emulator_pods.py:
nothing of a node outlives it), with the environment the Trainer injects (``PET_NNODES``, ``PET_NPROC_PER_NODE`` from the
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
import pathlib
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator

from k8s.builders import trainer_api
from tools.emulator_mounts import in_pod_namespaces
from tools.emulator_objects import (  # noqa: F401
    BACKOFF_LIMIT_EXCEEDED,
    DEADLINE_EXCEEDED,
    EVENT,
    FAIL_JOBSET,
    FAILED_JOBS,
    FAULT_ENV,
    JOBSET_ACTIONS,
    K8S_DEFAULT_GRACE_S,
    POD_FAILURE_ACTIONS,
    POD_FAILURE_POLICY,
    REACHED_MAX_RESTARTS,
    SIGTERM_LINE,
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
from tools.emulator_output import DEFAULT_LOG_MAX_BYTES, CappedLog
from tools.emulator_pods import container_exit_code as _container_exit_code  # noqa: F401
from tools.emulator_pods import request_stop, say
from tools.emulator_pods import run_pods as _run_pods
from workloads.builders.trainjobs import TINY_PROFILE

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


# the programs' fault hooks (workloads/programs/trainlib.py): the node SIGKILLed, or told to stop (SIGTERM)
FAULT_KINDS = {"kill": FAULT_ENV, "preempt": "TRAINING_PREEMPT_AT_STEP", "hang": "TRAINING_FAULT_HANG_AT_STEP", "full": "TRAINING_FAULT_DISK_FULL_AT_STEP"}
STALL_ENV = "TRAINING_STALL_TIMEOUT_S"


def _pod_env(job: Job, extra: dict[str, str], tmp: str, fault: tuple[str, int] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FAULT_KINDS.values()}
    env.update(extra)
    if fault is not None:
        env[FAULT_KINDS[fault[0]]] = str(fault[1])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchrun of this environment
    os.makedirs(tmp, exist_ok=True)
    env.update(TMPDIR=tmp, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # CPU nodes: the launcher's preflight finds no GPUs or EFA devices, and expects none here
    env.update(TRAINING_EXPECTED_GPUS="0", TRAINING_EXPECTED_EFA="0", NODE_NAME="emulated")
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


def _node_env(job: Job, node: int, port: int, fault: tuple[str, int] | None, tmp: str, tf_port: int) -> dict[str, str]:
    env = _pod_env(job, job.env, tmp, fault)
    env.update(
        PET_NNODES=str(job.num_nodes), PET_NPROC_PER_NODE=str(job.nproc_per_node), PET_NODE_RANK=str(node),
        PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port),
        TF_PORT=str(tf_port),  # the TF_CONFIG wrapper (k8s/pods/tf_config.py): worker i listens on TF_PORT + i here
    )
    return env


TAIL_LINES = 8  # a failed pod's last lines, in the summary


def program_tail(lines: list[str], n: int = TAIL_LINES) -> list[str]:
    """The last lines the program printed: torchrun's own report of a failed worker (its traceback
    of ChildFailedError and the summary table that follows) is cut off."""
    cut = len(lines)
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):") and any("torchrun" in x or "torch/distributed/run.py" in x for x in lines[i + 1 : i + 4]):
            cut = i
            break
    return lines[:cut][-n:]


def run_attempt(job: Job, attempt_no: int, fail: dict | None, timeout_s: float, quiet: bool, tmp_root: str) -> Attempt:
    """Run the initializers, then every node; watch rank 0's events and inject the failure."""
    tmp = os.path.join(tmp_root, f"attempt-{attempt_no}")
    for init in job.init_jobs:
        names = [f"{job.name}-{init.name}-0-{i}" for i in range(init.replicas)]
        init_command = in_pod_namespaces(init.command, {}) or init.command  # its processes end with it, as a pod's
        cmds = [(init_command, _pod_env(job, init.env, os.path.join(tmp, init.name, str(i)), None)) for i in range(init.replicas)]
        result = _run_pods(cmds, names, f"attempt {attempt_no} {init.name}", timeout_s, quiet)
        if result.failed or result.timed_out:
            result.failed_job = init.name
            return result
    port, tf_port = _free_port(), _free_ports(job.num_nodes)
    inject = fail if fail is not None and not fail.get("done") else None  # the failure this attempt injects
    if inject is not None:
        inject["done"] = True  # once: later attempts run clean
        what = {"kill": "SIGKILLed", "preempt": "sent SIGTERM (preempted)", "hang": "hung (it stops before the next collective)", "full": "out of checkpoint space (its save fails: the volume is full)"}[inject["kind"]]
        print(f"emulate: node {inject['node']} will be {what} at step {inject['step']}", flush=True)

    def fault_step(n: int) -> tuple[str, int] | None:
        return (inject["kind"], inject["step"]) if inject is not None and n == inject["node"] else None

    names = [f"{job.name}-{trainer_api.TRAINER_JOB}-0-{n}" for n in range(job.num_nodes)]
    command = in_pod_namespaces(job.command, job.mounts) or job.command
    cmds = [(command, _node_env(job, n, port, fault_step(n), os.path.join(tmp, f"node-{n}"), tf_port)) for n in range(job.num_nodes)]
    return _run_pods(cmds, names, f"attempt {attempt_no} node", timeout_s, quiet, ranks=[_ranks(job, n) for n in range(job.num_nodes)])


def _ranks(job: Job, node: int) -> str:
    """The global ranks a node's workers have (node-major, as torchrun numbers them)."""
    first = node * job.nproc_per_node
    return f"rank {first}" if job.nproc_per_node == 1 else f"ranks {first}-{first + job.nproc_per_node - 1}"


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


def emulate(
    job: Job, *, fail_node: int | None, fail_at_step: int | None, timeout_s: float = 900, quiet: bool = False, preempt_node: int | None = None, preempt_at_step: int | None = None,
    hang_node: int | None = None, hang_at_step: int | None = None, stall_timeout: int | None = None, fill_volume_at_step: int | None = None,
) -> dict:
    check_fault(job, fail_node, fail_at_step)
    check_fault(job, preempt_node, preempt_at_step)
    fail = {"node": fail_node, "step": fail_at_step, "kind": "kill"} if fail_node is not None and fail_at_step is not None else None
    if preempt_node is not None and preempt_at_step is not None:
        fail = {"node": preempt_node, "step": preempt_at_step, "kind": "preempt"}
    if hang_node is not None and hang_at_step is not None:
        check_fault(job, hang_node, hang_at_step)
        fail = {"node": hang_node, "step": hang_at_step, "kind": "hang"}
    if fill_volume_at_step is not None:  # every node: the shared volume is full for all of them
        check_fail_step(fill_volume_at_step, job.last_step)
        job.env[FAULT_KINDS["full"]] = str(fill_volume_at_step)
    if stall_timeout is not None:
        job.env[STALL_ENV] = str(stall_timeout)
    restarts = counted = 0
    reason = message = None
    failed_job = ""
    failure: dict | None = None
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
            first = attempt.failed[0] if attempt.failed else None
            if first is not None:
                n = int(first.pod.rsplit("-", 1)[1])
                where = f"node {n} ({_ranks(job, n)})" if not init else f"{init.name} pod {n}"
                last = program_tail(attempt.tails.get(n, []))
                failure = {"pod": first.pod, "where": where, "exit_code": first.exit_code, "last_lines": list(last)}
                say(f"emulate: {where} exited with code {first.exit_code}" + ("; its last lines:" if last else "; it printed nothing"))
                for line in last:
                    say(f"emulate:   | {line}")
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
        "failure": failure if status == "Failed" else None,
    }


def summary_line(r: dict) -> str:
    resumed = "none" if r["resumed_from_step"] is None else r["resumed_from_step"]
    line = (
        f"emulate: job={r['job']} status={r['status']} nodes={r['nodes']} world_size={r['world_size']} restarts={r['restarts']} "
        f"resumed_from_step={resumed} final_step={r['final_step']} final_loss={r['final_loss']}"
    )
    if r.get("busbw_gbps") is not None:  # the all-reduce check's figure
        line += f" busbw_gbps={r['busbw_gbps']}"
    line += f" reason={r['reason']}" if r.get("reason") else ""
    if r.get("failure"):  # which node and rank, and its exit code
        f = r["failure"]
        line += f" failed_pod={f['pod']} exit_code={f['exit_code']}"
    return line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run a rendered TrainJob locally (CPU, gloo)")
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--project", choices=("", "workloads"), default="", help="workloads: --stack is a TrainJob stack (its run, on its platform stack's runtime; --job is not used)")
    ap.add_argument("--job", choices=sorted(TINY_PROFILE), default="ddp")
    ap.add_argument("--fail-node", type=int)
    ap.add_argument("--fail-at-step", type=int)
    ap.add_argument("--preempt-node", type=int, help="with --preempt-at-step: this node gets SIGTERM after that step (a spot interruption, Kueue preemption or drain); the job saves that step and resumes from it")
    ap.add_argument("--preempt-at-step", type=int)
    ap.add_argument("--hang-node", type=int, help="with --hang-at-step: this node stops after that step, so every node blocks in the next collective")
    ap.add_argument("--hang-at-step", type=int)
    ap.add_argument("--fill-volume-at-step", type=int, help="the checkpoint volume is full at that step's save (every node): the job must stop with a clear message, not crash-loop")
    ap.add_argument("--stall-timeout", type=int, help="seconds without step progress before a node stops (default: the TrainJob's TRAINING_STALL_TIMEOUT_S)")
    ap.add_argument("--work-dir", help="local volumes, kept (default: a temporary directory, removed at the end)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per attempt")
    ap.add_argument("--quiet", action="store_true", help="only events and the summary")
    ap.add_argument("--python", help=f"interpreter for the image's python3 (default: this one; --job tf: {TF_VENV}/bin/python)")
    ap.add_argument("--trainjob", metavar="FILE", help="run the TrainJob of this file (trainctl submit --dry-run output) on the stack's runtime, instead of --job")
    ap.add_argument("--log-file", help="write the output here instead, rotated to FILE.1 when it reaches --log-max-bytes")
    ap.add_argument("--log-max-bytes", type=int, default=DEFAULT_LOG_MAX_BYTES, help=f"the cap of --log-file (default {DEFAULT_LOG_MAX_BYTES} bytes)")
    ap.add_argument("--result-file", help="also write the summary as JSON here (trainctl's local mode reads it)")
    ap.add_argument("--hub-dir", help="local hub (datasets/<owner>/<name>, models/<owner>/<name>) the emulated initializers read; default: tiny fixtures in the work directory")
    args = ap.parse_args(argv)
    # stopped (trainctl delete --local, a terminal's kill): every node gets SIGTERM and its grace period, then SIGKILL
    signal.signal(signal.SIGTERM, request_stop)
    if args.log_file:  # everything the emulator prints, in a file with a cap (rotated once)
        sys.stdout = sys.stderr = CappedLog(args.log_file, args.log_max_bytes)
    if (args.fail_node is None) != (args.fail_at_step is None):
        ap.error("--fail-node and --fail-at-step go together")
    if (args.preempt_node is None) != (args.preempt_at_step is None):
        ap.error("--preempt-node and --preempt-at-step go together")
    if (args.hang_node is None) != (args.hang_at_step is None):
        ap.error("--hang-node and --hang-at-step go together")
    if sum(x is not None for x in (args.fail_node, args.preempt_node, args.hang_node)) > 1:
        ap.error("one fault a run: --fail-node, --preempt-node or --hang-node")
    try:
        for at_step in (args.fail_at_step, args.preempt_at_step):  # before rendering or starting anything
            if at_step is not None:
                check_fail_step(at_step, None if args.trainjob or args.project else max_steps(TINY_PROFILE[args.job]))
        with contextlib.ExitStack() as stack:
            work = args.work_dir or stack.enter_context(_temp_root(f"emulate-{args.stack}-{'trainjob' if args.trainjob else args.job}-"))
            if args.trainjob:
                job = load_trainjob_file(args.trainjob, args.stack, work, python=args.python)
            else:
                job = load_job(args.stack, None if args.project else args.job, work, python=args.python, hub_dir=args.hub_dir, project=args.project)
            for init in job.init_jobs:
                print(f"emulate: {init.name} first ({init.env.get(trainer_api.STORAGE_URI_ENV, 'no ' + trainer_api.STORAGE_URI_ENV)})", flush=True)
            print(
                f"emulate: {job.name}: {job.num_nodes} nodes x {job.nproc_per_node} processes, maxRestarts={job.max_restarts}, volumes: "
                + ", ".join(f"{k} -> {v}" for k, v in job.mounts.items()), flush=True,
            )
            r = emulate(
                job, fail_node=args.fail_node, fail_at_step=args.fail_at_step, timeout_s=args.timeout, quiet=args.quiet, preempt_node=args.preempt_node, preempt_at_step=args.preempt_at_step,
                hang_node=args.hang_node, hang_at_step=args.hang_at_step, stall_timeout=args.stall_timeout, fill_volume_at_step=args.fill_volume_at_step,
            )
    except EmulationError as err:
        print(f"emulate: {err}", file=sys.stderr)
        return 2
    print(summary_line(r), flush=True)
    if args.result_file:
        pathlib.Path(args.result_file).write_text(json.dumps({k: v for k, v in r.items() if k != "result"} | {"result": r["result"]}, default=str))
    return 0 if r["status"] == "Complete" else 1

if __name__ == "__main__":
    sys.exit(main())
