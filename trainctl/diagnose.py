"""Why a TrainJob failed or does not start, from what the controllers wrote: each finding is a
cause, the evidence lines that show it, and what to do. Pure: it reads objects and log lines as
the cluster (or the local emulator) hands them over.

Shapes it reads (upstream, at the pinned versions):
- Pod ``status.containerStatuses[].state|lastState.terminated`` (``reason: OOMKilled``,
  ``exitCode``) and ``.waiting`` (``ErrImagePull``/``ImagePullBackOff``); pod conditions
  ``DisruptionTarget`` (``PreemptionByScheduler``, ``DeletionByTaintManager``,
  ``TerminationByKubelet``: Kubernetes "Pod disruption conditions").
- Kueue Workload ``status.conditions``: ``QuotaReserved`` False with the flavor assigner's message
  ("couldn't assign flavors to pod set ...: insufficient quota ..."), ``Evicted`` with reason
  ``Preempted``/``PodsReadyTimeout``, ``Deactivated``/``RequeuingLimitExceeded``.
- Events: the scheduler's and Karpenter's ``FailedScheduling``/``FailedLaunch``/
  ``InsufficientCapacityError`` ("no instance type satisfied ..."), a node's ``Xid``
  (NVIDIA driver errors, reported by the node monitoring agent), spot interruption
  (``SpotInterrupted``/``Disrupt...``).
- Nodes: ``Ready`` False, ``AcceleratedHardwareReady`` False (eks-node-monitoring-agent).
- The programs' lines: ``CUDA out of memory``, NCCL's watchdog timeout, the stall watchdog.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

NON_RETRYABLE = {2: "bad arguments", 3: "bad config or data"}
DEPS_FAILED_EXIT = 4  # the launcher's exit when the code's requirements.txt did not install (workloads/programs/launch.py DEPS_FAILED)
DEPS_CANNOT_INSTALL_EXIT = 3  # the same when no retry changes it: a conflict, a permission error (launch.py DEPS_CANNOT_INSTALL)
DEPS_CAUSE = "dependencies failed to install"  # also the launcher's marker line and termination message (launch.py DEPS_FAILED_TEXT)
DEPS_LINE = re.compile(r"TRAINING_DEPS_FAILED " + DEPS_CAUSE + r": (.*)")
DEPS_HINT = "fix requirements.txt (a name or version the index lacks, a conflict with what the image has: then a team image with --image), or raise --deps-timeout; the line is pip's last error"


@dataclass
class Finding:
    cause: str
    evidence: list[str] = field(default_factory=list)
    hint: str = ""

    def as_dict(self) -> dict:
        return {"cause": self.cause, "evidence": self.evidence, "hint": self.hint}


@dataclass
class Evidence:
    """What was gathered about one job."""

    trainjob: dict | None = None
    pods: list[dict] = field(default_factory=list)
    workloads: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # of the job, its workload, pods, nodes and node claims
    nodes: list[dict] = field(default_factory=list)  # the nodes its pods ran on
    log_lines: dict[str, list[str]] = field(default_factory=dict)  # pod -> its last lines
    exit_codes: dict[str, int] = field(default_factory=dict)  # pod -> exit code (local runs)
    refused: list[str] = field(default_factory=list)  # reads the API server refused ("not allowed: ..." lines)


_LOG_PATTERNS = [
    (re.compile(r"CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError"), "out of GPU memory", "lower the batch size per GPU, enable activation checkpointing, or use more GPUs (FSDP shards the state)"),
    (re.compile(r"Watchdog caught collective operation timeout|NCCL (?:communicator was aborted|timeout)|ProcessGroupNCCL.*[Tt]imeout|Connection reset by peer.*gloo|Gloo connectFullMesh failed"), "NCCL/collective timeout or hang", "a rank stopped or a link is down: check the other nodes' logs and their GPUs (diagnose the node); EFA jobs: the security group and placement"),
    (re.compile(r"stalled: no step progress"), "no step progress (hang guard)", "the job hung (a collective or a node): it is restarted; if it repeats, check the nodes' GPUs and network"),
    (re.compile(r"checkpoint volume full"), "checkpoint volume full", "free space on the checkpoint volume (old jobs' directories) or enlarge it, then resubmit"),
    (DEPS_LINE, DEPS_CAUSE, DEPS_HINT),
    (re.compile(r"\bXid\b"), "GPU fault (Xid)", "the node's GPU reported an error: the node should be repaired or replaced; the job restarts elsewhere"),
]


def _terminated(pod: dict) -> Iterable[tuple[str, dict]]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for where in ("state", "lastState"):
            t = (cs.get(where) or {}).get("terminated")
            if t:
                yield cs.get("name", ""), t


def _cond(obj: dict, kind: str) -> dict | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "?")


NO_CAPACITY = "no capacity (Karpenter cannot launch)"
# Karpenter v1.14.1's events (pkg/controllers/provisioning/scheduling/events.go, nodeclaim/lifecycle/
# events.go): on a pod it cannot place, FailedScheduling "Failed to schedule pod, <why>"; on a
# NodeClaim, InsufficientCapacityError or NodeClassNotReady; on a NodePool, NoCompatibleInstanceTypes.
# The kube-scheduler's FailedScheduling ("0/N nodes are available: ...") comes before every launch.
KARPENTER_REASONS = ("InsufficientCapacityError", "NodeClassNotReady", "NoCompatibleInstanceTypes", "FailedLaunch", "LaunchFailed")


def _karpenter_cannot(e: dict) -> bool:
    reason, msg = e.get("reason", ""), e.get("message", "")
    return reason in KARPENTER_REASONS or msg.startswith("Failed to schedule pod, ") or "InsufficientInstanceCapacity" in msg


def _capacity_hint(msg: str) -> str:
    if "exceed limits" in msg:
        return "the GPU pool is at its limit (gpuPool.gpuLimit, or the EFA pool's): wait for other jobs to finish, use fewer GPUs, or raise the limit"
    if "no instance type met the scheduling requirements" in msg:
        # Karpenter leaves out the types the NodePool's remaining limit cannot hold, so a pool near its limit says this too
        return "no instance type the pool may still launch fits the pod (its resources=... above): the pool may be near its GPU limit (wait for other jobs), or ask for another type or fewer GPUs per node"
    return "no GPU node of the type could be launched (capacity, the pool's instance types, the zone): try another type or zone, or wait"


def _when(e: dict) -> str:
    return str(e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp") or "")


NOT_ALLOWED = "evidence you may not read"


def diagnose(ev: Evidence) -> list[Finding]:
    found: dict[str, Finding] = {}

    def add(cause: str, line: str, hint: str) -> None:
        f = found.setdefault(cause, Finding(cause, hint=hint))
        if line not in f.evidence and len(f.evidence) < 6:
            f.evidence.append(line)

    # exit codes and container ends
    codes = dict(ev.exit_codes)
    for pod in ev.pods:
        for container, t in _terminated(pod):
            if t.get("reason") == "OOMKilled":
                add("out of memory (host)", f"pod {_name(pod)} container {container}: OOMKilled (exit {t.get('exitCode')})", "the pod exceeded its memory limit: fewer DataLoader workers, smaller host-side buffers, or a larger instance type")
            if t.get("exitCode") not in (None, 0):
                codes.setdefault(_name(pod), t["exitCode"])
            if t.get("exitCode") in (DEPS_FAILED_EXIT, DEPS_CANNOT_INSTALL_EXIT) and str(t.get("message") or "").startswith(DEPS_CAUSE):  # the launcher's termination message
                add(DEPS_CAUSE, f"pod {_name(pod)}: {str(t['message']).strip()}", DEPS_HINT)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            w = (cs.get("state") or {}).get("waiting") or {}
            if w.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                add("image pull", f"pod {_name(pod)}: {w['reason']}: {w.get('message', '')}".strip(), "check the image name and tag, and that the nodes may pull it (ECR: the node role; private registries: an imagePullSecret)")
        dt = _cond(pod, "DisruptionTarget")
        if dt and dt.get("status") == "True":
            add("preemption or eviction", f"pod {_name(pod)}: DisruptionTarget {dt.get('reason')}: {dt.get('message', '')}".strip(), "the job was stopped from outside (preemption, spot interruption, a drain); it resumes from its checkpoint")
    for pod, code in codes.items():
        if code in NON_RETRYABLE:
            add("non-retryable exit", f"{pod}: exit code {code} ({NON_RETRYABLE[code]})", "the program said it can never succeed like this: fix the arguments, config or data (see its last lines), then resubmit")
        elif code == 137:
            add("killed (SIGKILL)", f"{pod}: exit code 137", "killed: out of memory, a node that went away, or a grace period that ran out")
        elif code == 143:
            add("preemption or eviction", f"{pod}: exit code 143 (saved and left on SIGTERM)", "the job was stopped from outside; it resumes from the step it saved")
        elif code == DEPS_FAILED_EXIT and DEPS_CAUSE not in found:
            add(DEPS_CAUSE, f"{pod}: exit code {code} (the launcher: requirements.txt did not install)", DEPS_HINT)
        elif code == 124:
            add("no step progress (hang guard)", f"{pod}: exit code 124", "the job hung (a collective or a node): it is restarted; if it repeats, check the nodes")
    # the programs' own lines
    for pod, lines in ev.log_lines.items():
        for line in lines:
            for pattern, cause, hint in _LOG_PATTERNS:
                if pattern.search(line):
                    add(cause, f"{pod}: {line.strip().removeprefix('TRAINING_DEPS_FAILED ')}", hint)
    # Kueue
    for wl in ev.workloads:
        qr = _cond(wl, "QuotaReserved")
        if qr and qr.get("status") == "False" and not _cond(wl, "Admitted"):
            add("Kueue: pending", f"workload {_name(wl)}: {qr.get('reason', '')}: {qr.get('message', '')}".strip(), "the queue's quota is in use or no flavor fits the job: wait, lower its GPUs, or ask for more quota (trainctl list shows what runs)")
        ev_c = _cond(wl, "Evicted")
        if ev_c and ev_c.get("status") == "True":
            cause = "preemption or eviction" if ev_c.get("reason") == "Preempted" else "Kueue: evicted"
            add(cause, f"workload {_name(wl)}: Evicted {ev_c.get('reason')}: {ev_c.get('message', '')}".strip(), "preempted by a higher-priority job or reclaimed quota (it resumes), or its pods did not start in time (PodsReadyTimeout: see image pull and capacity)")
        deact = _cond(wl, "Deactivated") or (_cond(wl, "Requeued") if (_cond(wl, "Requeued") or {}).get("reason") == "RequeuingLimitExceeded" else None)
        if deact and deact.get("status") in ("True", "False") and "RequeuingLimitExceeded" in (deact.get("reason", "") + deact.get("message", "")):
            add("Kueue: gave up after requeues", f"workload {_name(wl)}: {deact.get('reason')}: {deact.get('message', '')}".strip(), "its pods never all started within kueue.podsReadyTimeout: see capacity and image pull findings")
    # events: scheduling, Karpenter, GPU faults, spot
    unscheduled: dict[str, str] = {}  # pod -> the scheduler's newest word on it
    said: set[str] = set()
    for e in sorted(ev.events, key=_when):
        reason, msg = e.get("reason", ""), e.get("message", "")
        involved = e.get("involvedObject") or {}
        obj = f"{involved.get('kind', '')}/{involved.get('name', '')}"
        if _karpenter_cannot(e) and msg not in said:  # the same words for every pod of the job: once
            said.add(msg)
            if "pvc" in msg.lower() or "PersistentVolumeClaim" in msg:
                add("volume not ready", f"{obj}: {reason}: {msg}", "a volume the pod mounts (the checkpoint claim) is not bound yet: usually for seconds after the namespace is made; if it lasts, kubectl get pvc in the namespace")
            else:
                add(NO_CAPACITY, f"{obj}: {reason}: {msg}", _capacity_hint(msg))
        elif reason == "FailedScheduling":
            unscheduled[involved.get("name", "")] = f"{obj}: {reason}: {msg}"
        if "Xid" in msg:
            add("GPU fault (Xid)", f"{obj}: {reason}: {msg}", "the node's GPU reported an error: it should be repaired or replaced; the job restarts elsewhere")
        if "SpotInterrupt" in reason or "spot interruption" in msg.lower() or reason in ("Preempted", "Evicted"):
            add("preemption or eviction", f"{obj}: {reason}: {msg}", "the job was stopped from outside; it resumes from its checkpoint")
    # the scheduler finds no node for every pod until Karpenter's node is up: a finding only for a
    # pod that is still waiting when Karpenter has said nothing of it
    if NO_CAPACITY not in found:
        for pod in ev.pods:
            waiting = (pod.get("status") or {}).get("phase") == "Pending" and not (pod.get("spec") or {}).get("nodeName")
            if waiting and _name(pod) in unscheduled:
                add("waiting for a node", unscheduled[_name(pod)], "no node fits yet: Karpenter launches one within minutes; if it persists, look at the pool's NodeClaims and Karpenter's events")
    for node in ev.nodes:
        for kind in ("Ready", "AcceleratedHardwareReady"):
            c = _cond(node, kind)
            if c and c.get("status") != "True":
                add("node fault", f"node {_name(node)}: {kind}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}".strip(), "a node of the job is unhealthy: node repair replaces it; the job restarts on a healthy one")
    # the TrainJob's own end
    if ev.trainjob:
        failed = _cond(ev.trainjob, "Failed")
        if failed and failed.get("status") == "True" and "Deadline" in (failed.get("reason", "") + failed.get("message", "")):
            add("deadline exceeded", f"trainjob {_name(ev.trainjob)}: {failed.get('reason')}: {failed.get('message', '')}", "the job ran past trainjobs.<job>.activeDeadlineSeconds: raise it or make the job shorter")
    # what could not be read: said, so that an empty finding list never means "nothing wrong" by mistake
    for line in ev.refused:
        add(NOT_ALLOWED, line, "the API server refused these reads, so the findings above may miss their causes: ask the platform team for the read access docs/debugging.md lists")
    return list(found.values())
