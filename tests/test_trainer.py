"""Kubeflow Trainer release and ClusterTrainingRuntimes, for both supported versions."""

import json
import re

import pytest

from config.schema import ConfigError
from config.settings import TrainerSettings, load_settings
from k8s.builders import runtimes as rt
from k8s.pods.tf_config import from_env, tf_config, worker_hosts
from tests.conftest import dev_config, objects, run_config, run_stack
from tools import validate as v

VERSIONS = ["v2.1.0", "v2.3.0"]


def node_pod(runtime):
    job = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    return job["template"]["spec"]["template"]


@pytest.mark.parametrize("version", VERSIONS)
def test_runtimes_rendered_and_valid_for_each_version(need_schemas, version):
    run = run_config(dev_config(trainer={"version": version, "maxRestarts": 7, "shmSize": "32Gi"}))
    rts = [o for o in objects(run).values() if o["kind"] == "ClusterTrainingRuntime"]
    assert {r["metadata"]["labels"][rt.RUNTIME_LABEL] for r in rts} == {"torch-distributed-gpu", "torch-distributed-gpu-hf", "deepspeed-distributed-gpu", "tensorflow-distributed"}
    for r in rts:
        assert re.fullmatch(r["metadata"]["labels"][rt.RUNTIME_LABEL] + "-[0-9a-f]{8}", r["metadata"]["name"])
    for r in rts:  # the API server judges the embedded JobSet template with the runtime's CRD
        assert v.validate(r, version) == []
    torch = [r for r in rts if r["metadata"]["labels"][rt.RUNTIME_LABEL] == "torch-distributed-gpu"][0]
    assert torch["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert torch["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 7
    pod = node_pod(torch)
    assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    shm = [vol for vol in pod["spec"]["volumes"] if vol["name"] == "dshm"][0]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["spec"]["containers"][0]["name"] == "node"
    assert "ttlSecondsAfterFinished" not in json.dumps(torch)
    if version == "v2.1.0":
        assert torch["spec"]["mlPolicy"]["torch"] == {"numProcPerNode": "auto"}
    else:
        assert "numProcPerNode" not in torch["spec"]["mlPolicy"]["torch"]


def test_failure_rules_fail_fast_on_non_retryable_exits_and_spare_restarts_on_disruption():
    r = rt.torch_runtime(TrainerSettings())
    fp = r["spec"]["template"]["spec"]["failurePolicy"]
    actions = {rule["name"]: rule["action"] for rule in fp["rules"]}
    assert actions == {"NonRetryableExit": "FailJobSet", "NodeDisruption": "RestartJobSetAndIgnoreMaxRestarts"}
    job = r["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 0
    assert job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [2, 3]
    pattern = fp["rules"][0]["onJobFailureMessagePatterns"][0]
    assert re.search(pattern, "Container node for pod training/x-node-0-1 failed with exit code 3 matching FailJob rule at index 0")
    assert not re.search(pattern, "Container node for pod training/x-node-0-1 failed with exit code 1 matching FailJob rule at index 0")


def test_runtimes_never_set_efa_env():
    """EFA env is per job (only jobs that get EFA devices); a shared runtime must not force it."""
    for base in rt.BUILDERS:
        env = node_pod(rt.BUILDERS[base](TrainerSettings()))["spec"]["containers"][0]["env"]
        assert all(not e["name"].startswith("FI_") for e in env)


def test_runtime_name_follows_immutable_parts_only():
    base = rt.torch_runtime(TrainerSettings())
    restarts = rt.torch_runtime(TrainerSettings(max_restarts=9))
    shm = rt.torch_runtime(TrainerSettings(shm_size="32Gi"))
    assert base["metadata"]["name"] != restarts["metadata"]["name"]  # failurePolicy is immutable
    assert base["metadata"]["name"] == shm["metadata"]["name"]  # the pod template is not
    assert node_pod(shm) != node_pod(base)
    assert base["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"


def test_trainjobs_reference_the_current_runtime_name():
    for restarts in (3, 9):
        run = run_config(dev_config(trainer={"maxRestarts": restarts}))
        names = {o["metadata"]["name"] for o in objects(run).values() if o["kind"] == "ClusterTrainingRuntime"}
        refs = {o["spec"]["runtimeRef"]["name"] for o in objects(run).values() if o["kind"] == "TrainJob"}
        assert refs and refs <= names


def test_trainer_release_in_plan_and_runtimes_depend_on_it():
    run = run_config(dev_config(trainer={"version": "v2.1.0"}))
    rel = [r for r in run.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kubeflow-trainer"][0]
    assert rel.inputs["chart"] == "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
    assert rel.inputs["version"] == "2.1.0"
    assert "runtimes" not in rel.inputs["values"]  # v2.1.0's chart has no runtimes of its own, nor the key
    v23 = [r for r in run_stack("dev").by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kubeflow-trainer"][0]
    assert v23.inputs["values"]["runtimes"]["defaultEnabled"] is False
    assert rel.inputs["values"]["jobset"]["image"] == {"repository": "registry.k8s.io/jobset/jobset", "tag": "v0.10.1"}
    assert rel.inputs["skipAwait"] is False
    for r in run.by_type("kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime"):
        assert rel.urn in r.depends_on


def test_only_configured_runtimes_are_installed():
    run = run_config(dev_config(trainer={"runtimes": ["torch-distributed-gpu"]}, trainjobs={"ddp": {"enabled": False}, "fsdp": {"enabled": False}, "tf": {"enabled": False}, "ncclCheck": {"enabled": False}}))
    names = [o["metadata"]["labels"][rt.RUNTIME_LABEL] for o in objects(run).values() if o["kind"] == "ClusterTrainingRuntime"]
    assert names == ["torch-distributed-gpu"]


def test_tf_config_for_three_nodes():
    addr = "mnist-tf-node-0-0.mnist-tf"
    configs = [tf_config(nnodes=3, node_rank=i, master_addr=addr) for i in range(3)]
    hosts = ["mnist-tf-node-0-0.mnist-tf:2222", "mnist-tf-node-0-1.mnist-tf:2222", "mnist-tf-node-0-2.mnist-tf:2222"]
    for i, cfg in enumerate(configs):
        assert json.loads(json.dumps(cfg)) == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
    # the job name is not assumed: any name works, even one containing "-node-"
    assert worker_hosts(nnodes=2, master_addr="my-node-job-node-0-0.my-node-job") == ["my-node-job-node-0-0.my-node-job:2222", "my-node-job-node-0-1.my-node-job:2222"]
    assert from_env({"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": addr})["task"]["index"] == 2
    with pytest.raises(ValueError):
        tf_config(nnodes=2, node_rank=2, master_addr=addr)


def test_tf_wrapper_sets_tf_config_and_execs(tmp_path):
    import os
    import subprocess

    cmd = rt.tf_config_wrapper() + ["python3", "-c", "import os; print(os.environ['TF_CONFIG'])"]
    env = {**os.environ, "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "j-node-0-0.j"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["task"] == {"type": "worker", "index": 1}


TRAINER_INVALID = [
    ({"trainer": {"version": "v2.2.0"}}, "trainer.version"),
    ({"trainer": {"maxRestarts": -1}}, "trainer.maxRestarts"),
    ({"trainer": {"shmSize": "lots"}}, "trainer.shmSize"),
    ({"trainer": {"shmSize": "0Gi"}}, "trainer.shmSize"),
    ({"trainer": {"runtimes": ["jax-distributed"]}}, "trainer.runtimes[0]"),
    ({"trainer": {"runtimes": ["torch-distributed-gpu", "torch-distributed-gpu"]}}, "trainer.runtimes[1]"),  # the repeat, by its index
]


@pytest.mark.parametrize("raw,key", TRAINER_INVALID, ids=[c[1] for c in TRAINER_INVALID])
def test_trainer_config_rejections(raw, key):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert err.value.key == key


# --- switching the installed Trainer release (docs/trainer-upgrade.md) ---------------------------


def _run_with_installed(installed: str | None, **trainer):
    from tests.conftest import PROJECT, dev_config
    from tools.mock_runtime import run_program

    params = {"/training-platform/training-dev/trainer-version": installed} if installed else {}
    return run_program(str(PROJECT), "dev", stack_config={"config": dev_config(trainer=trainer)}, ssm_parameters=params)


def test_in_place_trainer_switch_is_refused_with_the_procedure_and_nothing_registered():
    from tools.mock_runtime import ProgramError

    with pytest.raises(ProgramError) as err:
        _run_with_installed("v2.1.0", version="v2.3.0")
    assert "training-platform:trainer.version = 'v2.3.0'" in str(err.value)
    assert "docs/trainer-upgrade.md" in str(err.value) and "trainer.allowUpgradeFrom: v2.1.0" in str(err.value)
    assert [r for r in err.value.registrations if r.custom] == []


def test_acknowledged_trainer_upgrade_renders_and_records_the_new_release():
    run = _run_with_installed("v2.1.0", version="v2.3.0", allowUpgradeFrom="v2.1.0")
    param = run.one("aws:ssm/parameter:Parameter", "trainer-version")
    assert param.state["value"] == "v2.3.0" and param.inputs["name"] == "/training-platform/training-dev/trainer-version"
    release = [r for r in run.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kubeflow-trainer"][0]
    assert release.urn in param.depends_on  # recorded only once the release is installed


def test_downgrade_is_refused_even_when_acknowledged():
    from tools.mock_runtime import ProgramError

    with pytest.raises(ProgramError, match="going back"):
        _run_with_installed("v2.3.0", version="v2.1.0", allowUpgradeFrom="v2.3.0")


@pytest.mark.parametrize("installed", [None, "v2.3.0"])
def test_first_deploy_or_same_release_needs_nothing(installed):
    assert _run_with_installed(installed, version="v2.3.0").one("aws:ssm/parameter:Parameter", "trainer-version")
