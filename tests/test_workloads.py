"""TrainJobs from stack config: shape per Trainer version, sizing from the catalog, code, storage."""

import pytest

from config.schema import ConfigError
from config.settings import load_settings
from k8s.builders import trainer_api
from tests.conftest import dev_config, find, objects, run_config, run_stack
from tools import validate as v
from workloads.builders import trainjobs as tj

P5_EFA = {"efa": {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}, "gpuPool": {"gpuLimit": 64}}


def pod_spec(job):
    return trainer_api.read_pod_customization(job["spec"])


@pytest.mark.parametrize("version,field", [("v2.1.0", "podTemplateOverrides"), ("v2.3.0", "runtimePatches")])
def test_trainjobs_take_the_shape_of_the_trainer_version_and_validate(need_schemas, version, field):
    run = run_config(dev_config(trainer={"version": version}))
    jobs = [o for o in objects(run).values() if o["kind"] == "TrainJob"]
    assert {j["metadata"]["name"] for j in jobs} == {"ddp-mnist", "fsdp-t5", "tf-mnist", "nccl-check"}
    for job in jobs:
        assert field in job["spec"]
        other = {"podTemplateOverrides", "runtimePatches"} - {field}
        assert not other & set(job["spec"])
        assert v.validate(job, version) == []
        runtime = "tensorflow-distributed-" if job["metadata"]["name"] == "tf-mnist" else "torch-distributed-gpu-"
        assert job["spec"]["runtimeRef"]["name"].startswith(runtime)
    if version == "v2.3.0":
        patch = find(run, "TrainJob", "ddp-mnist")["spec"]["runtimePatches"][0]
        assert "/" in patch["manager"] and "." in patch["manager"].split("/")[0]


def test_ddp_job_sizing_command_and_volumes():
    run = run_stack("dev")
    job = find(run, "TrainJob", "ddp-mnist")
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 2
    assert trainer["numProcPerNode"] == 1  # g5.xlarge has one GPU
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    assert "vpc.amazonaws.com/efa" not in trainer["resourcesPerNode"]["limits"]
    assert trainer["command"] == ["python3", "/opt/training/code/launch.py", "torchrun", "/opt/training/code/ddp_mnist.py"]
    assert trainer["args"][:2] == ["--epochs", "3"]
    assert "--checkpoint-dir" in trainer["args"] and "/mnt/checkpoints/ddp-mnist" in trainer["args"]
    assert "git" not in " ".join(trainer["command"] + trainer["args"]) and "pip" not in " ".join(trainer["command"] + trainer["args"])
    spec = pod_spec(job)
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "g5.xlarge"}
    vols = {vol["name"]: vol for vol in spec["volumes"]}
    assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == "checkpoints"
    cm_name = vols["training-code"]["configMap"]["name"]
    cm = find(run, "ConfigMap", cm_name)
    assert set(cm["data"]) >= {"ddp_mnist.py", "fsdp_t5.py", "trainlib.py", "launch.py"}
    assert cm["immutable"] is True
    assert cm["data"]["ddp_mnist.py"] == (tj.PROGRAMS_DIR / "ddp_mnist.py").read_text()


def test_fsdp_job_uses_all_gpus_of_its_type_and_the_model():
    job = find(run_stack("dev"), "TrainJob", "fsdp-t5")["spec"]["trainer"]
    assert job["numProcPerNode"] == 4  # g5.12xlarge
    assert job["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 4
    assert job["args"][job["args"].index("--model") + 1] == "google-t5/t5-large"


def test_gpus_per_node_override_zone_and_extra_args():
    run = run_config(dev_config(trainjobs={"fsdp": {"gpusPerNode": 2, "availabilityZone": "us-west-2b", "extraArgs": ["--activation-checkpointing"]}}))
    job = find(run, "TrainJob", "fsdp-t5")
    assert job["spec"]["trainer"]["numProcPerNode"] == 2
    assert job["spec"]["trainer"]["args"][-1] == "--activation-checkpointing"
    assert pod_spec(job)["nodeSelector"]["topology.kubernetes.io/zone"] == "us-west-2b"


def test_efa_types_request_efa_devices_and_the_efa_pool():
    run = run_config(dev_config(**P5_EFA, trainjobs={"fsdp": {"instanceType": "p5.48xlarge", "numNodes": 4}}))
    job = find(run, "TrainJob", "fsdp-t5")
    limits = job["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert limits["vpc.amazonaws.com/efa"] == 32 and limits["nvidia.com/gpu"] == 8
    assert pod_spec(job)["nodeSelector"]["training-platform/efa"] == "true"


def test_code_change_renames_the_configmap():
    files = tj.code_files()
    changed = {**files, "ddp_mnist.py": files["ddp_mnist.py"] + "\n# change\n"}
    assert tj.code_configmap_name(files) != tj.code_configmap_name(changed)


def test_trainjobs_are_replaced_not_patched_and_depend_on_runtime_code_and_pools():
    run = run_stack("dev")
    job = run.one("kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob", "trainjob-training-ddp-mnist")
    assert job.replace_on_changes == ["spec", "metadata.labels"] and job.delete_before_replace
    deps = " ".join(job.depends_on)
    assert "torch-distributed-gpu" in deps and "training-code" in deps and "NodePool" in deps and "PersistentVolumeClaim" in deps


def test_fsx_storage_by_default_and_efs_on_request():
    run = run_stack("dev")
    fsx = run.one("aws:fsx/lustreFileSystem:LustreFileSystem").inputs
    assert fsx["deploymentType"] == "PERSISTENT_2" and fsx["storageCapacity"] == 1200
    addons = {r.inputs["addonName"] for r in run.by_type("aws:eks/addon:Addon")}
    assert "aws-fsx-csi-driver" in addons
    pv = find(run, "PersistentVolume")
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com" and pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["csi"]["volumeHandle"].startswith("fs-")
    efs = run_config(dev_config(trainjobs={"checkpointStorage": {"type": "efs"}}))
    assert efs.one("aws:efs/fileSystem:FileSystem").inputs["encrypted"] is True
    assert len(efs.by_type("aws:efs/mountTarget:MountTarget")) == 2
    assert find(efs, "PersistentVolume")["spec"]["csi"]["driver"] == "efs.csi.aws.com"


def test_no_jobs_no_storage_or_namespace():
    run = run_config(dev_config(trainjobs={key: {"enabled": False} for key in tj.WORKLOADS}))
    assert not run.by_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert not [o for o in objects(run).values() if o["kind"] == "TrainJob" or (o["kind"] == "Namespace" and o["metadata"]["name"] == "training")]


def test_built_in_workload_objects_validate(need_schemas):
    for obj in objects(run_stack("dev")).values():
        if obj["kind"] in ("Namespace", "ConfigMap", "PersistentVolume", "PersistentVolumeClaim"):
            assert v.validate(obj) == []


JOB_INVALID = [
    ({"trainjobs": {"ddp": {"enabled": True, "numNodes": 0}}}, "trainjobs.ddp.numNodes"),
    ({"trainjobs": {"ddp": {"enabled": True, "instanceType": "g5.xlarge", "gpusPerNode": 2}}}, "trainjobs.ddp.gpusPerNode"),
    ({"trainjobs": {"fsdp": {"enabled": True, "instanceType": "m5.large"}}}, "trainjobs.fsdp.instanceType"),
    ({"gpuPool": {"instanceFamilies": ["g6"]}, "trainjobs": {"ddp": {"enabled": True, "instanceType": "g5.xlarge"}}}, "trainjobs.ddp.instanceType"),
    ({"trainjobs": {"ddp": {"enabled": True, "image": "pytorch/pytorch:latest"}}}, "trainjobs.ddp.image"),
    ({"trainjobs": {"ddp": {"enabled": True, "image": "pytorch/pytorch"}}}, "trainjobs.ddp.image"),
    ({"trainjobs": {"ddp": {"enabeld": True}}}, "trainjobs.ddp.enabeld"),
    ({"trainjobs": {"fsdp": {"enabled": True, "numNodes": 8}}}, "trainjobs.fsdp.numNodes"),
    ({"trainjobs": {"namespace": "Training_Jobs"}}, "trainjobs.namespace"),
    ({"trainjobs": {"checkpointStorage": {"type": "s3"}}}, "trainjobs.checkpointStorage.type"),
    ({"trainjobs": {"ddp": {"enabled": True, "availabilityZone": "us-east-1a"}}}, "trainjobs.ddp.availabilityZone"),
]


@pytest.mark.parametrize("raw,key", JOB_INVALID, ids=[c[1] + str(i) for i, c in enumerate(JOB_INVALID)])
def test_job_config_rejections(raw, key):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert err.value.key == key


def test_effective_pods_merge_runtime_and_trainjob_and_validate():
    from tools.effective_pods import effective_jobs

    jobs = {j["metadata"]["name"]: j for j in effective_jobs(list(objects(run_stack("dev")).values()))}
    job = jobs["fsdp-t5-node"]
    assert v.validate(job) == []
    pod = job["spec"]["template"]["spec"]
    assert {vol["name"] for vol in pod["volumes"]} == {"dshm", "training-code", "checkpoints"}
    node = pod["containers"][0]
    assert {m["mountPath"] for m in node["volumeMounts"]} == {"/dev/shm", "/opt/training/code", "/mnt/checkpoints"}
    assert node["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod["automountServiceAccountToken"] is False
    assert node["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert job["spec"]["parallelism"] == 2


def test_trainjobs_start_only_after_the_checkpoint_root_is_handed_to_the_training_user():
    """The trainer pods run as the non-root uid; a new FSx/EFS root is root-owned, so the
    checkpoint-owner Job (run as root with CAP_CHOWN only) must complete before any TrainJob."""
    import versions
    from k8s.builders.volume_setup import owner_script

    run = run_stack("dev")
    (owner,) = [r for r in run.registrations if r.type == "kubernetes:batch/v1:Job" and r.inputs["metadata"]["name"].startswith("checkpoint-owner-")]
    spec = owner.inputs["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"][-1] == owner_script(int(versions.WORKLOAD_UID))
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert spec["volumes"][0]["persistentVolumeClaim"]["claimName"] == "checkpoints"
    jobs = [r for r in run.registrations if r.type.endswith(":TrainJob")]
    assert jobs and all(owner.urn in r.depends_on for r in jobs)
