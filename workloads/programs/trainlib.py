"""Shared runtime for the training programs: process group, metrics, batch plans, checkpoints.

Shipped next to the programs in the code ConfigMap (flat files, imported by name). Works the
same under torchrun on GPU nodes (NCCL) and on a laptop CPU (gloo).

Checkpoint layout, on durable shared storage::

    <dir>/step-00000012/   complete checkpoint (meta.json written last, then the rename)
    <dir>/.tmp-step-...    a save in progress: never loaded, removed by the next save

A save is written into a temporary directory and renamed into place only after every rank has
finished writing, so a crash mid-save never leaves a directory that loads as valid. That holds
for asynchronous saves too: the rename happens once the background write has finished. On start the
newest ``step-*`` directory with a ``meta.json`` is restored.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
import trainer_status

EXIT_BAD_CONFIG = 3  # non-retryable: the runtime's failure policy fails the job at once


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0


def setup() -> Dist:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    signal.signal(signal.SIGTERM, _on_sigterm)  # preemption: save at the current step (see preempted)
    return Dist(rank=rank, world_size=world, local_rank=local_rank, device=device)


# --- preemption --------------------------------------------------------------------------------
# A spot interruption, Kueue's preemption or a node drain deletes the pod: the kubelet sends
# SIGTERM (launch.py and torchrun pass it on to the workers), then SIGKILL after the pod's
# terminationGracePeriodSeconds. The workers note the signal, agree on it at the next step (one
# rank's signal is every rank's: a checkpoint is a collective), save that step and exit with
# PREEMPTED_EXIT, which the runtime's failure policy retries: the job resumes from that step.
PREEMPTED_EXIT = 143  # 128 + SIGTERM, as a process ended by it
PREEMPT_ENV = "TRAINING_PREEMPT_AT_STEP"
_sigterm: dict[str, float | None] = {"at": None}


def _on_sigterm(signum, _frame) -> None:
    if _sigterm["at"] is None:
        _sigterm["at"] = time.time()
        print("preemption: SIGTERM received; saving at the end of this step", file=sys.stderr, flush=True)


def preempted(d: Dist, step: int) -> bool:
    """After each step: whether any rank was told to stop (SIGTERM). With TRAINING_PREEMPT_AT_STEP=K
    in a node's environment (the emulator's --preempt-at-step), that node's launcher and workers
    get SIGTERM after step K, as from the kubelet."""
    target = os.environ.get(PREEMPT_ENV)
    if target and int(target) == step and _sigterm["at"] is None:
        for group in {os.getpgid(os.getppid()), os.getpgid(0)}:
            os.killpg(group, signal.SIGTERM)
    told = 1.0 if _sigterm["at"] is not None else 0.0
    return all_reduce_max(told, d.device) > 0 if d.world_size > 1 else told > 0


STALL_ENV = "TRAINING_STALL_TIMEOUT_S"  # set on the trainer by the TrainJob (trainjobs.<job>.stallTimeoutSeconds)
STALLED_EXIT = 124  # retryable: a hung collective (a stuck node or link) may not hang on new nodes
HANG_ENV = "TRAINING_FAULT_HANG_AT_STEP"  # fault injection: this node stops before the next collective


class Progress:
    """Step, total steps and ETA for the step events (``trainctl status``/``list`` show them): the
    rate is this attempt's, from the step it started at. With TRAINING_STALL_TIMEOUT_S set, a
    watchdog ends the node (exit 124, saying why) when no step completes for that long: a job hung
    in a collective holds its GPUs until someone notices, otherwise."""

    def __init__(self, start_step: int, total_steps: int):
        self.start_step, self.total_steps, self.t0 = start_step, total_steps, time.monotonic()
        self.last_step, self.last_at = start_step, time.monotonic()
        timeout = float(os.environ.get(STALL_ENV) or 0)
        if timeout > 0:
            threading.Thread(target=self._watch, args=(timeout,), daemon=True, name="stall-watchdog").start()

    def _watch(self, timeout: float) -> None:
        while True:
            time.sleep(min(timeout / 4, 5.0))
            idle = time.monotonic() - self.last_at
            if idle > timeout:
                print(f"stalled: no step progress for {idle:.0f} s after step {self.last_step} (limit {timeout:.0f} s): a hung collective or node; stopping", file=sys.stderr, flush=True)
                # the metric the platform's "stalled TrainJobs" alarm counts (infra/alarms.py)
                print(metric_line("stalled", job=job_name(), node=node_rank(), rank=_rank(), step=self.last_step, idle_s=round(idle), alert=ALERT_TOKENS["stalled"]), flush=True)
                _record_exit(STALLED_EXIT)
                os._exit(STALLED_EXIT)

    def step_done(self, step: int) -> None:
        self.last_step, self.last_at = step, time.monotonic()
        target = os.environ.get(HANG_ENV)
        if target and int(target) == step:
            print(f"fault injection: node hangs after step {step}", file=sys.stderr, flush=True)
            threading.Event().wait()  # never set: the peers block in the next collective

    def fields(self, step: int) -> dict:
        done = step - self.start_step
        rate = done / max(time.monotonic() - self.t0, 1e-9)
        eta = (self.total_steps - step) / rate if done > 0 else None
        return {"total_steps": self.total_steps, "eta_s": None if eta is None else round(eta, 1)}


def exit_preempted(d: Dist, step: int) -> NoReturn:
    """Leave after the preemption save: retryably, so the restarted job resumes from ``step``."""
    event(d, "preempted", step=step)
    _record_exit(PREEMPTED_EXIT)  # launch.py exits with it: the pod says it was stopped, not that it crashed
    teardown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT)


def teardown() -> None:
    if dist.is_initialized():
        dist.barrier()  # no rank tears its connections down while a peer still uses them
        dist.destroy_process_group()


def finish() -> None:
    """Leave after a successful run without the interpreter's teardown of the communication
    library's threads, which can abort a process whose work is already done and saved."""
    teardown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def broadcast_object(value, d: Dist):
    """Rank 0's ``value`` on every rank (a decision every rank must take alike)."""
    if not dist.is_initialized():
        return value
    holder = [value if d.is_main else None]
    dist.broadcast_object_list(holder, src=0, device=d.device if d.device.type == "cuda" else None)
    return holder[0]


def log(d: Dist, message: str) -> None:
    """One line from the whole job (rank 0), flushed."""
    if d.is_main:
        print(message, flush=True)


def event(d: Dist, kind: str, **fields) -> None:
    """Machine-readable progress line from rank 0 (the emulator and trainctl read them); step,
    eval and result events also go to the Trainer's status server where it serves one."""
    if d.is_main:
        print(f"TRAINING_EVENT {json.dumps({'event': kind, **fields}, sort_keys=True)}", flush=True)
        _report(kind, fields)


_STATUS = trainer_status.Reporter()
_METRICS: dict = {}  # the latest value of each metric the job reported
_METRIC_FIELDS = {"loss": "loss", "epoch": "epoch", "samples_per_s": "samples_per_s", "val_loss": "val_loss", "val_accuracy": "val_accuracy", "tokens_per_s": "tokens_per_s", "final_loss": "loss"}


GRACE_ENV = "TRAINING_TERMINATION_GRACE_S"  # the pod's terminationGracePeriodSeconds (k8s/builders/runtimes.py)
_grace_warned: list[bool] = []


def _check_grace(fields: dict) -> None:
    """Say once when a checkpoint takes more than half the pod's grace period: on preemption the
    in-flight step must finish and the save complete before SIGKILL, or the work since the last
    checkpoint is lost."""
    grace, seconds = float(os.environ.get(GRACE_ENV) or 0), float(fields.get("ckpt_total_s") or fields.get("seconds") or 0)
    if grace > 0 and seconds > grace / 2 and not _grace_warned:
        _grace_warned.append(True)
        print(f"checkpoint: saving step {fields.get('step')} took {seconds:.0f} s, more than half the pod's grace period ({grace:.0f} s): "
              f"a preemption may be killed before its save completes; raise trainjobs.<job>.terminationGraceSeconds (or trainer.terminationGraceSeconds)", file=sys.stderr, flush=True)


def _report(kind: str, fields: dict) -> None:
    if kind == "checkpoint":
        _check_grace(fields)
    _METRICS.update({name: fields[key] for key, name in _METRIC_FIELDS.items() if fields.get(key) is not None})
    if kind == "step":
        _STATUS.update(step=fields["step"], total_steps=fields.get("total_steps"), eta_s=fields.get("eta_s"), metrics=dict(_METRICS))
    elif kind == "result":
        final = fields.get("final_step") or 0
        _STATUS.final(step=final, total_steps=final, eta_s=0, metrics=dict(_METRICS))


# --- metrics: one JSON object per line, for the cluster's log pipeline -------------------------
#
# Container Insights' Fluent Bit parses a container log line that is a JSON object into fields
# (kubernetes filter, Merge_Log On, Merge_Log_Key log_processed: aws-observability/helm-charts
# charts/amazon-cloudwatch-observability values.yaml, application-log.conf), so CloudWatch Logs
# Insights queries them as log_processed.<field>; Loki's `| json` and Promtail parse the same
# lines. The first process of every node writes them, labelled with the job and the node rank.

METRIC_KEY = "training_metric"  # every metric line has it: its value says what the line reports
JOB_NAME_ENV = "TRAINING_JOB_NAME"  # set on the trainer container by the TrainJob (workloads/builders/trainjobs.py)


def job_name() -> str:
    """The TrainJob's name: the env the TrainJob sets, else the master address the Trainer gives
    every node (``<job>-node-0-0.<job>``), else ``unknown``."""
    name = os.environ.get(JOB_NAME_ENV)
    if name:
        return name
    master = os.environ.get("PET_MASTER_ADDR", "")
    return master.split(".", 1)[1] if "." in master else "unknown"


def node_rank() -> int:
    """This node's rank in the job: the Trainer's PET_NODE_RANK (torchrun gives workers GROUP_RANK)."""
    return int(os.environ.get("PET_NODE_RANK") or os.environ.get("GROUP_RANK") or 0)


def _finite(value):
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None  # JSON has no NaN; a parser would reject the line
    return value


def metric_line(kind: str, *, job: str, node: int, rank: int, **values) -> str:
    """One metric line: ``{"training_metric": kind, "job": ..., "node_rank": ..., "rank": ..., "time": ..., **values}``."""
    record = {METRIC_KEY: kind, "job": job, "node_rank": node, "rank": rank, "time": round(time.time(), 3)}
    record.update({k: _finite(v) for k, v in values.items()})
    return json.dumps(record, sort_keys=True, allow_nan=False)


def parse_metric_line(line: str) -> dict | None:
    """The record of a metric line, else None (any other output)."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and METRIC_KEY in record else None


def memory_gib(d: Dist) -> float:
    """Peak memory of this process: allocated on its GPU, or its resident set on CPU."""
    if d.device.type == "cuda":
        return torch.cuda.max_memory_allocated(d.device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def metric(d: Dist, kind: str, **values) -> None:
    """Write one metric line from the first process of each node (call it on every rank)."""
    if d.is_local_main:
        print(metric_line(kind, job=job_name(), node=node_rank(), rank=d.rank, **values), flush=True)


EXIT_FILE_ENV = "TRAINING_EXIT_CODE_FILE"  # set by launch.py


def _record_exit(code: int) -> None:
    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(f"{code}\n")


# A word the alarms' log metric filters look for (infra/alarms.py): no quotes or punctuation,
# so it reads the same in the line and in the JSON record Fluent Bit ships it in
ALERT_TOKENS = {"failed": "TRAINING_PLATFORM_JOB_FAILED", "stalled": "TRAINING_PLATFORM_JOB_STALLED"}


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def fail_config(message: str) -> NoReturn:
    """Stop for good: the job can never succeed with this configuration or data."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    # the metric the platform's "failed TrainJobs" alarm counts (infra/alarms.py)
    print(metric_line("failed", job=job_name(), node=node_rank(), rank=_rank(), exit_code=EXIT_BAD_CONFIG, alert=ALERT_TOKENS["failed"]), flush=True)
    _record_exit(EXIT_BAD_CONFIG)
    sys.exit(EXIT_BAD_CONFIG)


def usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    _record_exit(2)
    parser.error(message)


def parse_args(parser, argv=None):
    """argparse, with usage errors (exit 2) recorded as non-retryable for launch.py."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 2:
            _record_exit(2)
        raise


# --- batches ---------------------------------------------------------------------------------


def epoch_batches(lengths: Sequence[tuple[int, ...]], *, global_batch: int, seed: int, epoch: int, bucket_window: int = 0, granularity: int = 1) -> list[list[int]]:
    """The epoch's global batches as lists of sample indices: the same list on every rank, a
    function of (seed, epoch) only, so a resumed job continues at the exact next batch.

    Samples are shuffled, the tail that does not fill a global batch is dropped (every rank gets
    the same number of batches), and with ``bucket_window`` > 0 each run of ``bucket_window``
    global batches is sorted by length (longest first; ties keep the shuffled order) before it
    is cut into batches, whose order is then shuffled again. A sample's lengths (source, target)
    sort as a tuple whose leading ones are counted in units of ``granularity`` (the length a batch
    is rounded to), so samples whose sources round alike are ordered by their targets. Batches of similar lengths can be cut
    to their longest sample, so little of the step is spent on padding; the window keeps the
    randomness of what trains together. Rank ``r`` of ``W`` takes slice ``[r*B, (r+1)*B)`` of each.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    usable = len(order) // global_batch * global_batch
    order = order[:usable]
    if bucket_window > 0:
        span = global_batch * bucket_window
        def key(i: int) -> tuple[int, ...]:
            *leading, last = lengths[i]
            return (*(-(-n // granularity) for n in leading), last)

        order = [i for start in range(0, usable, span) for i in sorted(order[start : start + span], key=key, reverse=True)]
    batches = [order[start : start + global_batch] for start in range(0, usable, global_batch)]
    if bucket_window > 0:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    return batches


def padded_length(longest: int, multiple: int, cap: int) -> int:
    """A batch's length: its longest sample rounded up to ``multiple`` (fewer distinct shapes
    for compiled code and kernel autotuning), never beyond ``cap``."""
    return min(cap, -(-max(longest, 1) // multiple) * multiple)


FAULT_ENV = "TRAINING_FAULT_AT_STEP"
FAULT_ASYNC_SAVE_ENV = "TRAINING_FAULT_IN_ASYNC_SAVE"


def fault_point(step: int) -> None:
    """Fault injection for failure drills: with TRAINING_FAULT_AT_STEP=K in this node's
    environment, the node's whole process group (launcher and workers) is SIGKILLed right after
    step K, as if the node vanished. Unset in normal runs."""
    target = os.environ.get(FAULT_ENV)
    if target and int(target) == step:
        _kill_node(f"at step {step}")


def fault_in_async_save(step: int) -> None:
    """With TRAINING_FAULT_IN_ASYNC_SAVE=K, the node dies right after the asynchronous save of
    step K has started (its copy to host memory under way or taken) and before it can complete.
    Unset in normal runs."""
    target = os.environ.get(FAULT_ASYNC_SAVE_ENV)
    if target and int(target) == step:
        _kill_node(f"during the asynchronous save of step {step}")


def _kill_node(when: str) -> None:
    print(f"fault injection: SIGKILL node process group {when}", file=sys.stderr, flush=True)
    for group in {os.getpgid(os.getppid()), os.getpgid(0)}:  # the launcher's group, then ours
        if group != os.getpgid(0):
            os.killpg(group, signal.SIGKILL)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Every random draw of a step (dropout, augmentation) depends only on (seed, step, rank), so a
    resumed run makes exactly the draws the uninterrupted run made."""
    torch.manual_seed(seed * 1_000_003 + step * 1_009 + rank)
