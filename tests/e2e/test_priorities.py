"""Kueue priorities and preemption on the real API server, Kueue, Trainer and JobSet: the teams
stack's WorkloadPriorityClasses and ClusterQueue preemption policy decide, not our model of them.
Then ``trainctl diagnose`` reads the objects as the controllers wrote them.

The cohort of the teams stack holds 32 GPUs (vision 16, nlp 8, the stack's own jobs the other 8).
Its own cluster instance runs simulated pods for an hour (kwok's stage), so an admitted job keeps
its quota while the test looks."""

from __future__ import annotations

import json

import pytest

from k8s.builders.kueue import PRIORITIES, PRIORITY_LABEL
from tests.e2e.conftest import trainctl, wait_for
from tests.e2e.test_teams import _torch_runtime, as_team, submit_code
from trainctl import code, objects

STACK = "teams"
TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")


@pytest.fixture(scope="module")
def teams(clusters):
    up = clusters.get(STACK, instance="priorities", pod_run_seconds=3600)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    # the stack's own jobs would hold 10 of the cohort's GPUs for the hour: gone, the cohort is idle
    admin = up.client()
    namespace = next(o["metadata"]["namespace"] for o in up.plan.objects if o["kind"] == "TrainJob")
    for job in admin.list(*TRAINJOB, namespace):
        admin.delete(*TRAINJOB, job["metadata"]["name"], namespace)
    wait_for("the stack's own workloads gone", lambda: not admin.list(*WORKLOAD, namespace), up, timeout=90)
    yield up, access
    clusters.release(STACK, "priorities")


def _job(tmp_path, up, namespace: str, name: str, *, nodes: int, priority: str | None) -> tuple[dict, dict]:
    (tmp_path / "train.py").write_text("print('step')\n")
    req = objects.Request(namespace=namespace, nodes=nodes, command=["python", "train.py"], instance_type="g5.12xlarge", name=name, runtime_name=_torch_runtime(up), priority=priority)
    return objects.build(req, code.collect(tmp_path))


def _submit(client, up, tmp_path, namespace: str, name: str, *, nodes: int, priority: str | None) -> dict:
    configmap, job = _job(tmp_path, up, namespace, name, nodes=nodes, priority=priority)
    submit_code(client, configmap)
    client.create(job)
    return job


def _workload(admin, namespace: str, job: str) -> dict | None:
    for w in admin.list(*WORKLOAD, namespace):
        if any(r["name"] == job for r in w["metadata"].get("ownerReferences", [])):
            return w
    return None


def _cond(w: dict | None, kind: str) -> dict | None:
    return next((c for c in ((w or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def _holds(admin, namespace: str, job: str, kind: str) -> dict | None:
    """The job's Workload condition ``kind`` when it is True."""
    c = _cond(_workload(admin, namespace, job), kind)
    return c if c and c["status"] == "True" else None


def _admitted(admin, namespace: str, job: str):
    return _workload(admin, namespace, job) if _holds(admin, namespace, job, "Admitted") else None


def _diagnose(capsys, up, namespace: str, name: str) -> list[dict]:
    rc, out, err = trainctl(capsys, up, "diagnose", "-n", namespace, name, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def test_a_high_priority_job_preempts_a_low_one_in_its_queue_and_diagnose_says_so(teams, tmp_path, capsys):
    up, access = teams
    nlp = as_team(up, access, "nlp")
    admin = up.client()

    # a low-priority sweep borrows the whole idle cohort: 8 nodes x 4 GPUs = 32
    low = _submit(nlp, up, tmp_path, "nlp", "sweep", nodes=8, priority="low")
    assert low["metadata"]["labels"][PRIORITY_LABEL] == "low"
    w_low = wait_for("the low sweep admitted", lambda: _admitted(admin, "nlp", "sweep"), up, timeout=90)
    assert w_low["spec"]["priority"] == PRIORITIES["low"]  # Kueue resolved the WorkloadPriorityClass
    assert w_low["spec"]["priorityClassRef"]["name"] == "low"

    # the cohort is full, so a high job of 8 GPUs can only run by preempting the lower one
    _submit(nlp, up, tmp_path, "nlp", "deadline", nodes=2, priority="high")

    evicted = wait_for("the low sweep evicted by Kueue", lambda: _holds(admin, "nlp", "sweep", "Evicted"), up, timeout=90)
    assert evicted["reason"] == "Preempted", evicted
    pre = _holds(admin, "nlp", "sweep", "Preempted")
    assert pre and pre["reason"] == "InClusterQueue", pre
    w_high = wait_for("the high job admitted", lambda: _admitted(admin, "nlp", "deadline"), up, timeout=90)
    assert w_high["spec"]["priority"] == PRIORITIES["high"]
    # the preempted TrainJob is suspended (its pods get SIGTERM and the grace period: the checkpoint path)
    wait_for("the sweep TrainJob suspended", lambda: admin.get(*TRAINJOB, "sweep", "nlp")["spec"].get("suspend") is True, up, timeout=60)

    # diagnose, on the objects the controllers wrote
    findings = _diagnose(capsys, up, "nlp", "sweep")
    causes = {f["cause"] for f in findings}
    assert "preemption or eviction" in causes, findings
    evidence = " ".join(line for f in findings for line in f["evidence"])
    assert "Preempted" in evidence, findings


def test_a_job_of_equal_priority_waits_rather_than_preempts(teams, tmp_path, capsys):
    """withinClusterQueue: LowerPriority: the high job holds its GPUs against another high job, which
    waits with Kueue's reason; diagnose names the quota."""
    up, access = teams
    nlp = as_team(up, access, "nlp")
    admin = up.client()
    wait_for("the high job admitted", lambda: _admitted(admin, "nlp", "deadline"), up, timeout=90)
    _submit(nlp, up, tmp_path, "nlp", "also-high", nodes=7, priority="high")

    def pending():
        c = _cond(_workload(admin, "nlp", "also-high"), "QuotaReserved")
        return c if c and c["status"] == "False" and "insufficient" in c.get("message", "") else None

    reserved = wait_for("the second high job pending on quota", pending, up, timeout=60)
    assert "nvidia.com/gpu" in reserved["message"], reserved
    assert _admitted(admin, "nlp", "deadline") is not None  # not preempted
    findings = _diagnose(capsys, up, "nlp", "also-high")
    assert any(f["cause"].startswith("Kueue") and "quota" in " ".join(f["evidence"]) for f in findings), findings


def test_a_team_reclaims_its_quota_from_a_borrower_in_the_cohort(teams, tmp_path):
    """reclaimWithinCohort: Any: vision's guarantee (16 GPUs) lent to nlp's sweep comes back when
    vision needs it, whatever the priorities."""
    up, access = teams
    nlp, vision = as_team(up, access, "nlp"), as_team(up, access, "vision")
    admin = up.client()
    for job in admin.list(*TRAINJOB, "nlp"):
        admin.delete(*TRAINJOB, job["metadata"]["name"], "nlp")
    wait_for("nlp's workloads gone", lambda: not admin.list(*WORKLOAD, "nlp"), up, timeout=90)
    _submit(nlp, up, tmp_path, "nlp", "borrower", nodes=8, priority="high")
    wait_for("nlp's borrower admitted on the whole cohort", lambda: _admitted(admin, "nlp", "borrower"), up, timeout=90)
    _submit(vision, up, tmp_path, "vision", "guaranteed", nodes=4, priority="low")

    pre = wait_for("the borrower preempted for vision's quota", lambda: _holds(admin, "nlp", "borrower", "Preempted"), up, timeout=90)
    assert pre["reason"] == "InCohortReclamation", pre
    wait_for("vision's job admitted", lambda: _admitted(admin, "vision", "guaranteed"), up, timeout=90)
