"""trainctl usage: GPU-hours per team and per job from Workloads shaped as Kueue v0.19.2 writes
them (status.admission.clusterQueue and podSetAssignments[].resourceUsage; conditions
QuotaReserved/Admitted, Finished, Evicted with their lastTransitionTime)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from trainctl import cli, usage

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def workload(name: str, ns: str, queue: str, gpus: int, admitted: str | None, finished: str | None = None, evicted: str | None = None, pods: int = 2) -> dict:
    conditions = []
    if admitted:
        conditions += [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": admitted, "reason": "QuotaReserved"}, {"type": "Admitted", "status": "True", "lastTransitionTime": admitted, "reason": "Admitted"}]
    if finished:
        conditions.append({"type": "Finished", "status": "True", "lastTransitionTime": finished, "reason": "Succeeded"})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "lastTransitionTime": evicted, "reason": "Preempted"})
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"trainjob-{name}-a1b2c", "namespace": ns, "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name}]},
        "spec": {"queueName": "default", "podSets": [{"name": "node", "count": pods}]},
        "status": {
            "admission": {"clusterQueue": queue, "podSetAssignments": [{"name": "node", "count": pods, "flavors": {"nvidia.com/gpu": "gpu-pool"}, "resourceUsage": {"cpu": "16", "nvidia.com/gpu": str(gpus)}}]} if admitted else None,
            "conditions": conditions,
        },
    }


WORKLOADS = [
    workload("a", "vision", "team-vision", 8, "2026-11-24T08:00:00Z", "2026-11-24T10:00:00Z"),  # 8 GPUs x 2 h
    workload("b", "vision", "team-vision", 4, "2026-11-24T11:00:00Z"),  # running: 4 x 1 h up to now
    workload("c", "nlp", "team-nlp", 2, "2026-11-23T22:00:00Z", evicted="2026-11-24T01:00:00Z"),  # preempted: 2 x 3 h (2 x 1 h since midnight)
    workload("d", "nlp", "team-nlp", 8, None),  # pending: nothing
    workload("e", "training", "platform-jobs", 1, "2026-11-24T06:00:00Z", "2026-11-24T06:30:00Z"),
]


def test_gpu_hours_per_team_and_job():
    rs = usage.rows(WORKLOADS, since=datetime(2026, 11, 23, tzinfo=UTC), now=NOW)
    assert usage.per_team(rs) == {"nlp": 6.0, "platform-jobs": 0.5, "vision": 20.0}
    assert {(r.job, r.gpu_hours) for r in rs} == {("a", 16.0), ("b", 4.0), ("c", 6.0), ("e", 0.5)}
    assert next(r for r in rs if r.job == "b").end is None


def test_the_period_clips_what_ran_before_it_and_a_team_filter():
    rs = usage.rows(WORKLOADS, since=datetime(2026, 11, 24, tzinfo=UTC), now=NOW, team="nlp")
    assert [(r.job, r.gpu_hours) for r in rs] == [("c", 2.0)]
    assert usage.since_time("7d", NOW) == datetime(2026, 11, 17, 12, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="--since 'yesterday'"):
        usage.since_time("yesterday", NOW)


def test_csv_has_a_row_per_job():
    text = usage.to_csv(usage.rows(WORKLOADS, since=datetime(2026, 11, 23, tzinfo=UTC), now=NOW))
    lines = text.strip().splitlines()
    assert lines[0] == "team,namespace,job,gpus,start,end,gpu_hours" and len(lines) == 5
    assert "vision,vision,a,8,2026-11-24T08:00:00+00:00,2026-11-24T10:00:00+00:00,16.000" in lines


def test_the_cli_prints_them(monkeypatch, capsys):
    class FakeKube:
        def __init__(self, **_):
            pass

        def all_workloads(self, *, all_namespaces):
            assert all_namespaces
            return WORKLOADS

    monkeypatch.setattr(cli, "KubeApi", FakeKube)
    monkeypatch.setattr(cli, "_cluster", lambda args: FakeKube())
    assert cli.main(["usage", "-A", "--since", "3650d", "-o", "json"]) == 0
    out = capsys.readouterr().out
    assert '"nlp": 6.0' in out and '"platform-jobs": 0.5' in out
    assert cli.main(["usage", "-A", "--csv"]) == 0 and capsys.readouterr().out.startswith("team,namespace,job")


def test_usage_help_works():
    done = subprocess.run([sys.executable, "-m", "trainctl.cli", "usage", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--since" in done.stdout and "--csv" in done.stdout
