"""The node preflight (workloads/programs/launch.py) on CPU with faked devices: a node whose GPUs
or EFA devices are not what the job requested, or whose GPU check fails, stops before training
with one line naming the node, and retryably (the restarted job should land on a healthy node)."""

from __future__ import annotations

import launch  # the programs directory is on sys.path (tests/conftest.py)
import pytest

from tests.conftest import dev_config, objects, run_config


def env(**kw) -> dict:
    return {"TRAINING_PREFLIGHT": "1", "NODE_NAME": "ip-10-0-1-7", **kw}


@pytest.mark.parametrize("gpus,efa,want,problem", [
    (8, 32, {"TRAINING_EXPECTED_GPUS": "8", "TRAINING_EXPECTED_EFA": "32"}, None),
    (7, 32, {"TRAINING_EXPECTED_GPUS": "8", "TRAINING_EXPECTED_EFA": "32"}, "7 GPUs visible, the job requested 8"),
    (8, 16, {"TRAINING_EXPECTED_GPUS": "8", "TRAINING_EXPECTED_EFA": "32"}, "16 EFA devices, the job's layout needs 32"),
    (4, 0, {"TRAINING_EXPECTED_GPUS": "4"}, None),
])
def test_what_the_node_was_promised(gpus, efa, want, problem):
    assert launch.preflight(env(**want), gpus=lambda: gpus, efa=lambda: efa, health=lambda n: None) == problem


def test_a_failed_gpu_check_fails_the_preflight_with_the_node_named(capsys, monkeypatch):
    monkeypatch.setattr(launch, "preflight", lambda e: "GPU 3: CUDA error: an illegal memory access was encountered")
    assert launch.run_preflight(env(TRAINING_EXPECTED_GPUS="8")) == launch.PREFLIGHT_FAILED
    assert launch.PREFLIGHT_FAILED not in launch.NON_RETRYABLE  # retried, on another node
    err = capsys.readouterr().err
    assert err.strip() == "preflight failed on node ip-10-0-1-7: GPU 3: CUDA error: an illegal memory access was encountered"


def test_the_gpu_check_on_this_machine_and_off():
    assert launch.gpu_health(0) is None  # no GPUs: nothing to check
    assert launch.run_preflight({"TRAINING_EXPECTED_GPUS": "8"}) is None  # not asked for: no preflight
    assert launch.preflight(env(TRAINING_EXPECTED_GPUS="0")) is None  # a CPU job (the emulator)


def test_every_gpu_runtime_runs_the_preflight_and_every_job_says_what_it_expects():
    run = run_config(dev_config(efa={"enabled": True, "availabilityZone": "us-west-2a"}, trainjobs={"fsdp": {"enabled": True, "instanceType": "p5.48xlarge", "numNodes": 2, "availabilityZone": "us-west-2a"}}, gpuPool={"gpuLimit": 64}))
    objs = list(objects(run).values())
    runtimes = [o for o in objs if o["kind"] == "ClusterTrainingRuntime"]
    for rt in runtimes:
        node = next(rj for rj in rt["spec"]["template"]["spec"]["replicatedJobs"] if rj["name"] == "node")
        container = node["template"]["spec"]["template"]["spec"]["containers"][0]
        names = {e["name"]: e for e in container.get("env", [])}
        assert names["TRAINING_PREFLIGHT"]["value"] == "1" and names["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", rt["metadata"]["name"]
    fsdp = next(o for o in objs if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
    env_ = {e["name"]: e.get("value") for e in fsdp["spec"]["trainer"]["env"]}
    assert env_["TRAINING_EXPECTED_GPUS"] == "8" and env_["TRAINING_EXPECTED_EFA"] == "32"


def test_the_fence_taints_the_nodes_a_preflight_failed_on():
    from k8s.pods import preflight_fence as fence  # shipped as the CronJob's ConfigMap

    def pod(node, exit_code, message, where="state"):
        return {"spec": {"nodeName": node}, "status": {"containerStatuses": [{"name": "node", where: {"terminated": {"exitCode": exit_code, "message": message}}}]}}

    pods = [
        pod("ip-1", 5, "preflight failed on node ip-1: 7 GPUs visible, the job requested 8"),
        pod("ip-2", 5, "preflight failed on node ip-2: GPU 3: CUDA error", where="lastState"),  # restarted since
        pod("ip-3", 3, "bad config"),  # not a preflight
        pod("ip-4", 1, "preflight failed on node ip-4: lookalike with another code"),
    ]
    assert fence.failed_preflights(pods) == {"ip-1": "preflight failed on node ip-1: 7 GPUs visible, the job requested 8", "ip-2": "preflight failed on node ip-2: GPU 3: CUDA error"}
    node = {"metadata": {"name": "ip-1", "resourceVersion": "42"}, "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}
    patch = fence.fence_patch(node)
    assert patch["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}, fence.TAINT]  # the GPU taint kept
    assert patch["metadata"]["resourceVersion"] == "42" and patch["metadata"]["labels"] == {fence.REASON_LABEL: "true"}
    node["spec"]["taints"].append(fence.TAINT)
    assert fence.fence_patch(node) is None  # fenced already


def test_the_fence_runs_in_platform_ops_with_no_more_rights_than_it_needs():
    run = run_config(dev_config())
    objs = list(objects(run).values())
    cron = next(o for o in objs if o["kind"] == "CronJob" and o["metadata"]["name"] == "preflight-fence")
    assert cron["metadata"]["namespace"] == "platform-ops" and cron["spec"]["schedule"] == "*/2 * * * *"
    role = next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "preflight-fence")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    script = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("preflight-fence"))
    assert "preflight_fence.py" in script["data"]
