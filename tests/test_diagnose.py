"""trainctl diagnose on objects shaped as the upstream controllers write them (Kubernetes pod
status and disruption conditions, Kueue v0.19 Workload conditions, Karpenter and scheduler
events, the node monitoring agent's node condition, Trainer's TrainJob conditions)."""

from __future__ import annotations

import pytest

from trainctl.diagnose import Evidence, diagnose


def pod(name: str, *, terminated: dict | None = None, waiting: dict | None = None, conditions: list | None = None, last: dict | None = None) -> dict:
    cs = {"name": "node", "state": {}, "lastState": {}}
    if terminated:
        cs["state"]["terminated"] = terminated
    if waiting:
        cs["state"]["waiting"] = waiting
    if last:
        cs["lastState"]["terminated"] = last
    return {"metadata": {"name": name}, "status": {"phase": "Running", "containerStatuses": [cs], "conditions": conditions or []}}


def causes(ev: Evidence) -> dict[str, list[str]]:
    return {f.cause: f.evidence for f in diagnose(ev)}


CASES = [
    (Evidence(pods=[pod("j-node-0-0", last={"reason": "OOMKilled", "exitCode": 137})]), "out of memory (host)", "OOMKilled"),
    (Evidence(log_lines={"j-node-0-1": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]}), "out of GPU memory", "CUDA out of memory"),
    (Evidence(log_lines={"j-node-0-0": ["[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=600000)"]}), "NCCL/collective timeout or hang", "Watchdog caught"),
    (Evidence(pods=[pod("j-node-0-0", waiting={"reason": "ImagePullBackOff", "message": 'Back-off pulling image "repo/org/img:1"'})]), "image pull", "ImagePullBackOff"),
    (Evidence(workloads=[{"metadata": {"name": "trainjob-j-1a2b3"}, "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor gpu-pool, 8 more needed"}]}}]), "Kueue: pending", "insufficient unused quota"),
    (Evidence(workloads=[{"metadata": {"name": "trainjob-j-1a2b3"}, "status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload (UID: 7) due to prioritization in the ClusterQueue"}]}}]), "preemption or eviction", "Preempted"),
    (Evidence(events=[{"reason": "FailedScheduling", "message": "Failed to schedule pod, incompatible with nodepool \"gpu-pool\", no instance type satisfied resources {\"nvidia.com/gpu\":\"8\"}", "involvedObject": {"kind": "Pod", "name": "j-node-0-0"}}]), "no capacity (Karpenter cannot launch)", "no instance type satisfied"),
    (Evidence(events=[{"reason": "AcceleratedHardwareNotReady", "message": "NVRM: Xid (PCI:0000:10:1c): 79, GPU has fallen off the bus", "involvedObject": {"kind": "Node", "name": "ip-10-0-1-2"}}]), "GPU fault (Xid)", "Xid"),
    (Evidence(nodes=[{"metadata": {"name": "ip-10-0-1-2"}, "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error", "message": "GPU fell off the bus"}]}}]), "node fault", "AcceleratedHardwareReady=False"),
    (Evidence(trainjob={"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "TrainJob exceeded its activeDeadlineSeconds"}]}}), "deadline exceeded", "DeadlineExceeded"),
    (Evidence(pods=[pod("j-node-0-1", terminated={"reason": "Error", "exitCode": 3})]), "non-retryable exit", "exit code 3"),
    (Evidence(pods=[pod("j-node-0-1", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": "Pod was terminated in response to imminent node shutdown."}])]), "preemption or eviction", "TerminationByKubelet"),
    (Evidence(exit_codes={"j-node-0-0": 124}, log_lines={"node 0": ["stalled: no step progress for 1810 s after step 40 (limit 1800 s): a hung collective or node; stopping"]}), "no step progress (hang guard)", "no step progress"),
]


@pytest.mark.parametrize("ev,cause,evidence", CASES, ids=[c[1] for c in CASES])
def test_each_cause_is_named_with_its_evidence(ev, cause, evidence):
    found = causes(ev)
    assert cause in found, found
    assert any(evidence in line for line in found[cause])


def test_a_healthy_running_job_has_no_findings():
    healthy = Evidence(
        trainjob={"metadata": {"name": "j"}, "status": {"conditions": []}},
        pods=[pod("j-node-0-0"), pod("j-node-0-1")],
        workloads=[{"metadata": {"name": "trainjob-j-1"}, "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]}}],
        nodes=[{"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}],
        log_lines={"j-node-0-0": ["epoch 0 step 10: loss 2.1"]},
    )
    assert diagnose(healthy) == []


def test_progress_and_eta_from_a_pods_lines():
    from trainctl.progress import of_lines as progress_of

    lines = [
        "epoch 0",
        'TRAINING_EVENT {"epoch": 0, "eta_s": 12.5, "event": "step", "loss": 2.1, "step": 4, "total_steps": 12}',
        '{"training_metric": "step", "step": 4}',
        'TRAINING_EVENT {"epoch": 0, "eta_s": 6.0, "event": "step", "loss": 1.9, "step": 8, "total_steps": 12}',
        'TRAINING_EVENT {"event": "checkpoint", "step": 8}',
    ]
    assert progress_of(lines) == {"step": 8, "total_steps": 12, "eta_s": 6.0, "loss": 1.9, "source": "log"}
    assert progress_of(["no events"]) is None


SCHEDULER_SAYS = {"reason": "FailedScheduling", "message": "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling.",
                  "involvedObject": {"kind": "Pod", "name": "j-node-0-0"}, "lastTimestamp": "2026-11-25T03:00:00Z"}


def test_the_schedulers_words_before_a_launch_are_no_finding_once_the_pod_runs():
    """kube-scheduler says FailedScheduling for every pod before Karpenter's node is up: a job
    that then runs has nothing to diagnose."""
    running = pod("j-node-0-0")
    running["spec"] = {"nodeName": "ip-10-0-1-2"}
    assert diagnose(Evidence(pods=[running], events=[SCHEDULER_SAYS])) == []


def test_a_pod_still_waiting_with_only_the_schedulers_words_is_waiting_for_a_node():
    pending = {"metadata": {"name": "j-node-0-0"}, "spec": {}, "status": {"phase": "Pending"}}
    found = causes(Evidence(pods=[pending], events=[SCHEDULER_SAYS]))
    assert list(found) == ["waiting for a node"] and "0/4 nodes are available" in found["waiting for a node"][0]


def test_karpenters_limit_is_named_once_for_all_pods_and_outranks_the_scheduler():
    pending = [{"metadata": {"name": f"j-node-0-{i}"}, "spec": {}, "status": {"phase": "Pending"}} for i in range(4)]
    said = [{"reason": "FailedScheduling", "message": "Failed to schedule pod, all available instance types exceed limits for nodepool (NodePool=gpu-pool)",
             "involvedObject": {"kind": "Pod", "name": f"j-node-0-{i}"}, "source": {"component": "karpenter"}} for i in range(4)]
    findings = diagnose(Evidence(pods=pending, events=[SCHEDULER_SAYS, *said]))
    assert [f.cause for f in findings] == ["no capacity (Karpenter cannot launch)"]
    assert len(findings[0].evidence) == 1 and "gpuLimit" in findings[0].hint


def test_karpenter_waiting_for_a_volume_is_not_called_capacity():
    said = {"reason": "FailedScheduling", "message": "Failed to schedule pod, pvc is considered unbound because it does not contain annotation (PersistentVolume=training-checkpoints, PersistentVolumeClaim=checkpoints, annotation=pv.kubernetes.io/bind-completed)",
            "involvedObject": {"kind": "Pod", "name": "j-node-0-0"}, "source": {"component": "karpenter"}}
    found = causes(Evidence(events=[said]))
    assert list(found) == ["volume not ready"]
