"""The GPU pool on the real Karpenter (its kwok provider) with the stack's NodePools and feature
gates. A cluster of its own whose simulated pods run for an hour, so the stack's jobs hold their
nodes while the tests look:

* ``trainctl diagnose`` on what the controllers write when a job asks for more GPUs than the pool's
  limit (dev: 16): the scheduler and Karpenter say why on its pods, and diagnose names it;
* node repair (``NodeRepair``, on by the stack): a node unhealthy past the toleration is replaced
  although the platform's training pods carry ``karpenter.sh/do-not-disrupt`` and the NodePool has
  disruption budgets, and the job comes back on a new node. The kwok provider's repair policy is
  Ready False/Unknown for 10 minutes (kwok/cloudprovider RepairPolicies); AWS's adds the node
  monitoring agent's conditions (k8s/builders/gpu_objects.py), through the same controller."""

from __future__ import annotations

import datetime
import json

import pytest

from tests.e2e.conftest import trainctl, wait_for

STACK = "dev"
NS = "training"


@pytest.fixture(scope="module")
def dev(clusters):
    up = clusters.get(STACK, instance="gpu-capacity", pod_run_seconds=3600)
    # Karpenter says why it cannot place a pod once per pod and 5 minutes (its events' dedupe): the
    # first word must be the pool's limit, not the seconds before the checkpoint claim is bound
    client = up.client()
    wait_for("the checkpoint claim bound", lambda: "pv.kubernetes.io/bind-completed" in (client.get("v1", "PersistentVolumeClaim", "checkpoints", NS)["metadata"].get("annotations") or {}), up, timeout=60)
    # the stack's jobs placed first: a job beyond the limit would otherwise race them for the pool
    wait_for("ddp-mnist running on the GPU pool", lambda: len(_running_on(client, "ddp-mnist")) == 2, up, timeout=180)
    yield up
    clusters.release(STACK, "gpu-capacity")


def test_a_job_beyond_the_pools_gpu_limit_is_diagnosed_as_no_capacity(dev, capsys, tmp_path):
    (tmp_path / "train.py").write_text("print('step')\n")
    rc, _, err = trainctl(capsys, dev, "submit", "-n", NS, "--nodes", "5", "--instance-type", "g5.12xlarge", "--name", "too-wide", str(tmp_path), "--", "python", "train.py")
    assert rc == 0, err  # 5 x 4 = 20 GPUs against the pool's gpuLimit of 16
    client = dev.client()

    def karpenter_said():
        events = [e for e in client.list("v1", "Event", NS) if e["involvedObject"]["name"].startswith("too-wide-")]
        return [e for e in events if (e.get("source", {}).get("component") == "karpenter" or e.get("reportingComponent") == "karpenter") and e["reason"] == "FailedScheduling"]

    said = wait_for("Karpenter's word on the job's pods", karpenter_said, dev, timeout=120)
    rc, out, err = trainctl(capsys, dev, "diagnose", "-n", NS, "too-wide", "-o", "json")
    assert rc == 0, err
    findings = json.loads(out)
    capacity = [f for f in findings if f["cause"] == "no capacity (Karpenter cannot launch)"]
    assert capacity, (findings, [e["message"] for e in said])
    # Karpenter's words: "all available instance types exceed limits for nodepool" when nothing is
    # left, "no instance type met the scheduling requirements" when what is left holds no such node
    assert any("Failed to schedule pod, " in line for line in capacity[0]["evidence"]), json.dumps(capacity)
    assert "limit" in capacity[0]["hint"]
    # the scheduler's own "0/N nodes are available" precedes every launch: not a finding of its own here
    assert not any(line.split(": ", 2)[-1].startswith("0/") for f in findings for line in f["evidence"]), findings
    trainctl(capsys, dev, "delete", "-n", NS, "too-wide")


NODECLAIM = ("karpenter.sh/v1", "NodeClaim")


def _running_on(client, job: str) -> dict[str, str]:
    """Pod -> node of the job's trainer pods that are running on a node."""
    pods = client.list("v1", "Pod", NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={job}")
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}


def test_node_repair_replaces_an_unhealthy_node_under_a_do_not_disrupt_job(dev):
    client = dev.client()
    placed = wait_for("ddp-mnist running on the GPU pool", lambda: (lambda r: r if len(r) == 2 else None)(_running_on(client, "ddp-mnist")), dev, timeout=180)
    pod_name, node_name = sorted(placed.items())[0]
    pod = client.get("v1", "Pod", pod_name, NS)
    assert pod["metadata"]["annotations"].get("karpenter.sh/do-not-disrupt") == "true"  # the platform's runtimes set it
    node = client.get("v1", "Node", node_name)
    assert node["metadata"]["labels"].get("karpenter.sh/nodepool"), "a node Karpenter launched"
    claim = next(c for c in client.list(*NODECLAIM) if (c.get("status") or {}).get("nodeName") == node_name)

    # the node went NotReady 11 minutes ago (past the 10-minute toleration)
    since = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=11)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "container runtime is down", "lastHeartbeatTime": since, "lastTransitionTime": since}
    client.request("PATCH", client.path("v1", "Node", node_name) + "/status", body={"status": {"conditions": [ready]}}, content_type="application/strategic-merge-patch+json")

    wait_for("Karpenter deleting the unhealthy node's NodeClaim", lambda: (client.get_or_none(*NODECLAIM, claim["metadata"]["name"]) or {"metadata": {"deletionTimestamp": "gone"}})["metadata"].get("deletionTimestamp"), dev, timeout=120)
    wait_for("the unhealthy node gone", lambda: client.get_or_none("v1", "Node", node_name) is None, dev, timeout=180)
    # the job is back, on nodes that are not the broken one
    back = wait_for("ddp-mnist running again", lambda: (lambda r: r if len(r) == 2 and node_name not in r.values() else None)(_running_on(client, "ddp-mnist")), dev, timeout=240)
    assert pod_name not in back  # the drained node's pod was replaced (its Job made a new one)
