"""``trainctl diagnose`` on what the real controllers write: a job asking for more GPUs than the GPU
pool's limit (dev: 16) stays Pending, the scheduler and Karpenter say why on its pods, and diagnose
names it. A cluster of its own, since the job holds the pool at its limit while it waits."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import wait_for
from trainctl import cli

STACK = "dev"
NS = "training"


@pytest.fixture(scope="module")
def dev(clusters):
    return clusters.get(STACK, instance="capacity")


def _trainctl(capsys, up, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main([args[0], "--kubeconfig", str(up.kubeconfig), *args[1:]])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_job_beyond_the_pools_gpu_limit_is_diagnosed_as_no_capacity(dev, capsys, tmp_path):
    (tmp_path / "train.py").write_text("print('step')\n")
    rc, _, err = _trainctl(capsys, dev, "submit", "-n", NS, "--nodes", "5", "--instance-type", "g5.12xlarge", "--name", "too-wide", str(tmp_path), "--", "python", "train.py")
    assert rc == 0, err  # 5 x 4 = 20 GPUs against the pool's gpuLimit of 16
    client = dev.client()

    def karpenter_said():
        events = [e for e in client.list("v1", "Event", NS) if e["involvedObject"]["name"].startswith("too-wide-")]
        return [e for e in events if e.get("source", {}).get("component") == "karpenter" or e.get("reportingComponent") == "karpenter"]

    said = wait_for("Karpenter's events on the job's pods", karpenter_said, dev, timeout=120)
    rc, out, err = _trainctl(capsys, dev, "diagnose", "-n", NS, "too-wide", "-o", "json")
    assert rc == 0, err
    findings = json.loads(out)
    capacity = [f for f in findings if f["cause"] == "no capacity (Karpenter cannot launch)"]
    assert capacity, (findings, [e["message"] for e in said])
    assert any("exceed limits for nodepool" in line for line in capacity[0]["evidence"]), capacity
    assert "gpuLimit" in capacity[0]["hint"]
    # the scheduler's own "0/N nodes are available" precedes every launch: not a finding of its own here
    assert not any(line.split(": ", 2)[-1].startswith("0/") for f in findings for line in f["evidence"]), findings
    _trainctl(capsys, dev, "delete", "-n", NS, "too-wide")
