"""The TensorFlow job (trainjobs.tf) and the all-reduce check (trainjobs.ncclCheck): settings,
rendering on both Trainer versions, the bandwidth figures, and real runs on CPU."""

from __future__ import annotations

import importlib
import os
import re
import sys

import pytest

import versions
from config import catalog
from config.schema import ConfigError, ConfigErrors
from config.settings import DdpJobSettings, NcclCheckSettings, TfJobSettings, load_settings
from k8s.builders import runtimes as rt
from k8s.pods.tf_config import worker_hosts
from tests.conftest import PROJECT, dev_config, find, objects, run_config, run_stack
from tools import validate as v
from tools.emulate import TF_VENV, emulate, job_from_objects, load_job, summary_line
from workloads.builders import trainjobs as tj

sys.path.insert(0, str(tj.PROGRAMS_DIR))  # the programs import trainlib by name, as in the image
allreduce_check = importlib.import_module("allreduce_check")

VERSIONS = ["v2.1.0", "v2.3.0"]
P5_EFA = {"efa": {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}, "gpuPool": {"gpuLimit": 64}}
TF_PYTHON = PROJECT / TF_VENV / "bin" / "python"


def load(raw: dict):
    return load_settings(raw, stack="dev", region="us-west-2")


# --- settings ----------------------------------------------------------------------------------


def test_defaults_come_from_versions_and_the_gpu_catalog():
    assert TfJobSettings().image == versions.TENSORFLOW_RUNTIME_IMAGE
    check = NcclCheckSettings()
    assert (check.instance_type, check.num_nodes, check.min_bus_bw_g_bps) == ("p5.48xlarge", 2, None)
    assert check.pass_mark_gbps() == 400 == catalog.lookup("p5.48xlarge").min_allreduce_busbw_gbps
    assert NcclCheckSettings(minBusBwGBps=123.5).pass_mark_gbps() == 123.5  # type: ignore[call-arg]
    assert catalog.lookup("g5.xlarge").min_allreduce_busbw_gbps is None
    assert "epochs" not in NcclCheckSettings.model_fields  # a bandwidth check has no epochs


def test_tf_runtime_image_and_emulator_tensorflow_are_the_same_release():
    image_version = re.fullmatch(r"tensorflow/tensorflow:(\d+\.\d+\.\d+)-gpu", versions.TENSORFLOW_RUNTIME_IMAGE)
    pins = dict(line.split("==") for line in (PROJECT / "workloads" / "requirements-tf.txt").read_text().splitlines() if "==" in line)
    assert image_version and pins["tensorflow_cpu"] == image_version.group(1)


INVALID = [
    ({"tf": {"enabled": True, "epochs": 0}}, "trainjobs.tf.epochs", 0, "from 1 to 10000"),
    ({"tf": {"enabled": True, "image": "tensorflow/tensorflow:latest"}}, "trainjobs.tf.image", "tensorflow/tensorflow:latest", "pinned tag"),
    ({"tf": {"enabled": True, "extraArgs": ["--epochs=5"]}}, "trainjobs.tf.extraArgs[0]", "--epochs=5", "set trainjobs.tf.epochs instead"),
    ({"tf": {"enabled": True, "extraArgs": ["--checkpoint", "/x"]}}, "trainjobs.tf.extraArgs[0]", "--checkpoint", "argparse reads it as --checkpoint-dir"),
    ({"ncclCheck": {"enabled": True, "numNodes": 1}}, "trainjobs.ncclCheck.numNodes", 1, "from 2 to 1000"),
    ({"ncclCheck": {"enabled": True, "minBusBwGBps": -1}}, "trainjobs.ncclCheck.minBusBwGBps", -1, ">= 0"),
    ({"ncclCheck": {"enabled": True, "minBusBwGBps": "fast"}}, "trainjobs.ncclCheck.minBusBwGBps", "fast", "expected a number"),
    ({"ncclCheck": {"enabled": True, "minBusBwGBps": True}}, "trainjobs.ncclCheck.minBusBwGBps", True, "expected a number"),
    ({"ncclCheck": {"enabled": True, "instanceType": "g5.12xlarge"}}, "trainjobs.ncclCheck.minBusBwGBps", None, "required for g5.12xlarge"),
    ({"ncclCheck": {"enabled": True, "extraArgs": ["--min-busbw", "1"]}}, "trainjobs.ncclCheck.extraArgs[0]", "--min-busbw", "set trainjobs.ncclCheck.minBusBwGBps instead"),
    ({"ncclCheck": {"enabled": True, "epochs": 3}}, "trainjobs.ncclCheck.epochs", 3, "unknown key"),
    ({"ncclCheck": {"enabled": True, "instanceType": "m5.large"}}, "trainjobs.ncclCheck.instanceType", "m5.large", "not in the GPU instance catalog"),
]


@pytest.mark.parametrize(("jobs", "key", "value", "allowed"), INVALID, ids=[f"{c[1]}-{i}" for i, c in enumerate(INVALID)])
def test_bad_job_values_are_refused_naming_key_value_and_what_is_allowed(jobs, key, value, allowed):
    with pytest.raises(ConfigError) as err:
        load({"efa": P5_EFA["efa"], "gpuPool": P5_EFA["gpuPool"], "trainjobs": jobs})
    assert err.value.key == key and err.value.value == value, str(err.value)
    assert allowed in err.value.allowed and f"training-platform:{key} = {value!r}" in str(err.value)


def test_an_enabled_jobs_runtime_is_installed_even_when_the_list_leaves_it_out():
    # a stack file from before the FSDP job moved to the runtime with initializers keeps working
    s = load({"trainer": {"runtimes": ["torch-distributed-gpu"]}, "trainjobs": {"fsdp": {"enabled": True}, "tf": {"enabled": True}}})
    assert s.trainer.runtimes == ["torch-distributed-gpu", "torch-distributed-gpu-hf", "tensorflow-distributed"]
    s = load({"trainer": {"runtimes": ["tensorflow-distributed"]}, "trainjobs": {"ncclCheck": {"enabled": True, "instanceType": "g5.xlarge", "minBusBwGBps": 1}}})
    assert s.trainer.runtimes == ["tensorflow-distributed", "torch-distributed-gpu"]
    assert load({"trainer": {"runtimes": ["tensorflow-distributed"]}}).trainer.runtimes == ["tensorflow-distributed"]


def test_platform_flags_are_per_job_and_the_rest_is_judged_by_the_programs_parser():
    # --min-busbw-gbps is the check's flag (set by the platform there), not DDP's: ddp_mnist.py's own
    # parser has no such flag, and --epochs is DDP's, not the check's
    with pytest.raises(ConfigErrors) as err:
        load({"trainjobs": {"ddp": {"enabled": True, "extraArgs": ["--min-busbw-gbps=1"]}, "ncclCheck": {"enabled": True, "instanceType": "g5.xlarge", "minBusBwGBps": 1, "extraArgs": ["--epochs", "2"]}}})
    assert err.value.keys == ["trainjobs.ddp.extraArgs[0]", "trainjobs.ncclCheck.extraArgs[0]"]
    assert "ddp_mnist.py has no flag --min-busbw-gbps" in str(err.value) and "allreduce_check.py has no flag --epochs" in str(err.value)
    s = load({"trainjobs": {"ddp": {"enabled": True, "extraArgs": ["--lr", "0.01", "--batch=32"]}, "ncclCheck": {"enabled": True, "instanceType": "g5.xlarge", "minBusBwGBps": 1, "extraArgs": ["--max-bytes", "4G"]}}})
    assert s.trainjobs.ddp.extra_args == ["--lr", "0.01", "--batch=32"] and s.trainjobs.nccl_check.extra_args == ["--max-bytes", "4G"]


# --- the registry and the TrainJobs --------------------------------------------------------------


def test_every_workload_names_an_existing_program_runtime_and_config_key():
    keys = {f.alias for f in type(load({}).trainjobs).model_fields.values()}
    for key, w in tj.WORKLOADS.items():
        assert key == w.key and key in keys and (tj.PROGRAMS_DIR / w.program).is_file() and w.runtime in rt.BUILDERS
        assert tj.WORKLOAD_BY_KIND[w.kind] is w and tj.TINY_PROFILE[w.kind] == list(w.tiny_profile)
    assert (tj.WORKLOADS["tf"].runtime, tj.WORKLOADS["ncclCheck"].runtime) == (TfJobSettings.RUNTIME, DdpJobSettings.RUNTIME)


@pytest.mark.parametrize("version", VERSIONS)
def test_tf_and_nccl_check_trainjobs_render_and_validate_for_each_trainer_version(need_schemas, version):
    run = run_config(dev_config(trainer={"version": version}))
    objs = list(objects(run).values())
    runtimes = {o["metadata"]["labels"][rt.RUNTIME_LABEL]: o for o in objs if o["kind"] == "ClusterTrainingRuntime"}
    tf_job, check = find(run, "TrainJob", "tf-mnist"), find(run, "TrainJob", "nccl-check")
    for job in (tf_job, check):
        assert v.validate(job, version) == []
    assert v.runtime_ref_problems(objs) == []

    tf_rt = runtimes["tensorflow-distributed"]
    assert tf_job["spec"]["runtimeRef"]["name"] == tf_rt["metadata"]["name"]
    trainer = tf_job["spec"]["trainer"]
    assert "command" not in trainer  # the runtime's TF_CONFIG wrapper stays the command
    node = tf_rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert node["command"] == rt.tf_config_wrapper()
    launch = "/opt/training/code/launch.py"  # the node's preflight and exit codes, as for every GPU job
    assert trainer["args"] == ["python3", launch, "python3", launch, "--worker", "python3", "/opt/training/code/tf_mnist.py", "--epochs", "3", "--checkpoint-dir", "/mnt/checkpoints/tf-mnist"]
    # the default TensorFlow image, as the stack's ECR copy of it (infra/registry.py ImageMirror)
    assert trainer["image"].startswith("123456789012.dkr.ecr.us-west-2.amazonaws.com/training-dev-mirror/docker.io/" + versions.TENSORFLOW_RUNTIME_IMAGE + "@sha256:") and trainer["numNodes"] == 2
    assert trainer["numProcPerNode"] == 1 and trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1  # one worker drives the node's GPUs

    assert check["spec"]["runtimeRef"]["name"] == runtimes["torch-distributed-gpu"]["metadata"]["name"]
    c = check["spec"]["trainer"]
    assert c["command"] == ["python3", "/opt/training/code/launch.py", "torchrun", "/opt/training/code/allreduce_check.py"]
    assert c["args"] == ["--min-busbw-gbps", "0.5"]  # Pulumi.dev.yaml's pass mark
    code = find(run, "ConfigMap", trainer_api_code_volume(tf_job))
    assert {"tf_mnist.py", "allreduce_check.py"} <= set(code["data"])


def trainer_api_code_volume(job: dict) -> str:
    from k8s.builders import trainer_api

    return next(vol["configMap"]["name"] for vol in trainer_api.read_pod_customization(job["spec"])["volumes"] if "configMap" in vol)


def test_nccl_check_on_p5_gets_the_catalog_pass_mark_every_efa_device_and_the_efa_zone():
    run = run_config(dev_config(**P5_EFA, trainjobs={"ncclCheck": {"instanceType": "p5.48xlarge", "minBusBwGBps": None}}))
    job = find(run, "TrainJob", "nccl-check")
    trainer = job["spec"]["trainer"]
    assert trainer["args"] == ["--min-busbw-gbps", "400"]
    assert trainer["numProcPerNode"] == 8 and trainer["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == 32
    assert {"name": "FI_PROVIDER", "value": "efa"} in trainer["env"]
    from k8s.builders import trainer_api
    from k8s.builders.gpu_objects import EFA_LABEL

    selector = trainer_api.read_pod_customization(job["spec"])["nodeSelector"]
    assert selector[EFA_LABEL] == "true" and selector["topology.kubernetes.io/zone"] == "us-west-2a"


def test_the_builder_refuses_a_runtime_that_is_not_configured():
    s = load({"trainer": {"runtimes": ["torch-distributed-gpu"]}})
    with pytest.raises(ValueError, match="runtime tensorflow-distributed is not in trainer.runtimes"):
        tj.trainjob(tj.WORKLOADS["tf"], s.trainjobs.tf, s, code_configmap="code")
    with pytest.raises(TypeError):
        tj.program_args(tj.WORKLOADS["tf"], s.trainjobs.ddp)


def test_tf_config_on_one_host_gives_each_worker_its_port():
    assert worker_hosts(nnodes=3, master_addr="127.0.0.1", port=5000) == ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]
    assert worker_hosts(nnodes=2, master_addr="::1", port=5000) == ["[::1]:5000", "[::1]:5001"]
    assert worker_hosts(nnodes=2, master_addr="tf-mnist-node-0-0.tf-mnist") == ["tf-mnist-node-0-0.tf-mnist:2222", "tf-mnist-node-0-1.tf-mnist:2222"]


# --- the all-reduce figures ----------------------------------------------------------------------


def test_bus_bandwidth_is_nccl_tests_formula():
    # a row of the published 2 x p5.48xlarge (16 ranks) all_reduce_perf run (aws-samples/
    # awsome-distributed-training, micro-benchmarks/nccl-tests/README.md): 1 GiB in 4607.6 us ->
    # algbw 233.04, busbw 436.95 GB/s (from the unrounded time); by hand: 1073741824 / 1e9 /
    # 0.0046076 = 233.0371 GB/s, x 2 * 15 / 16 = 436.9446 GB/s
    algbw, busbw = allreduce_check.bandwidths(1073741824, 4607.6e-6, 16)
    assert algbw == pytest.approx(233.0371, abs=1e-4) and busbw == pytest.approx(436.9446, abs=1e-4)
    assert round(algbw, 2) == 233.04 and busbw == pytest.approx(436.95, abs=0.01)
    assert allreduce_check.bandwidths(2_000_000_000, 1.0, 2) == (2.0, 2.0)  # 2 ranks: 2*(2-1)/2 = 1
    assert allreduce_check.bandwidths(1_000_000_000, 0.5, 8) == (2.0, 3.5)  # 8 ranks: x 14/8
    assert allreduce_check.parse_size("8G") == 8 << 30 and allreduce_check.parse_size("64k") == 64 << 10 and allreduce_check.parse_size("12") == 12
    assert allreduce_check.sizes(1 << 20, 8 << 20, 2) == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    with pytest.raises(Exception, match="not a size"):
        allreduce_check.parse_size("1T")


# --- real runs (CPU) -----------------------------------------------------------------------------


@pytest.mark.slow
def test_nccl_check_passes_and_reports_busbw(tmp_path):
    job = load_job("dev", "nccl-check", str(tmp_path))
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Complete" and r["world_size"] == 2 and r["restarts"] == 0
    res = r["result"]
    assert res["passed"] is True and res["backend"] == "gloo" and res["world_size"] == 2 and res["size_bytes"] == 1 << 20
    assert r["busbw_gbps"] == res["busbw_gbps"] > 0 and res["busbw_gbps"] == round(res["algbw_gbps"] * 2 * (2 - 1) / 2, 3)
    assert re.search(r" status=Complete .* busbw_gbps=[0-9.]+$", summary_line(r))


@pytest.mark.slow
@pytest.mark.parametrize(("extra", "code"), [(["--min-busbw-gbps", "1e9"], 3), (["--factor", "1"], 2)], ids=["below-pass-mark", "bad-args"])
def test_nccl_check_failures_are_not_retried(extra, code, tmp_path, capsys):
    objs = list(objects(run_stack("dev")).values())
    job = job_from_objects(objs, "dev", "nccl-check", str(tmp_path))
    job.command = job.command + extra  # the last value of an option wins
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert r["status"] == "Failed" and r["restarts"] == 0 and r["reason"] == "FailJobSetFailurePolicyAction"
    out = capsys.readouterr().out
    assert re.search(rf"Container node for pod training/nccl-check-node-0-[01] failed with exit code {code} matching FailJob rule", out), out
    if code == 3:
        assert r["result"]["passed"] is False and r["busbw_gbps"] is not None  # the figure is still reported


@pytest.mark.slow
def test_tf_job_resumes_after_a_node_failure_with_the_same_result(tmp_path):
    if not TF_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{TF_VENV} is missing: CI runs `make venv-tf` before the tests")
        pytest.skip(f"TensorFlow not installed: `make venv-tf` creates {TF_VENV}")
    clean = emulate(load_job("dev", "tf", str(tmp_path / "clean")), fail_node=None, fail_at_step=None, timeout_s=300, quiet=True)
    assert clean["status"] == "Complete" and clean["world_size"] == 2 and clean["restarts"] == 0 and clean["final_step"] == 12
    assert clean["result"]["world_size"] == 2  # two workers in one sync group

    failed_dir = tmp_path / "failed"
    failed = emulate(load_job("dev", "tf", str(failed_dir)), fail_node=1, fail_at_step=5, timeout_s=300, quiet=True)
    assert failed["status"] == "Complete" and failed["restarts"] == 1 and failed["resumed_from_step"] == 4  # a checkpoint every 2 steps
    assert failed["final_step"] == 12 and failed["final_loss"] == clean["final_loss"]
    # only the chief wrote to the shared volume (workers write to their own temporary directories)
    shared = sorted(os.listdir(failed_dir / "volumes" / "checkpoints" / "tf-mnist"))
    assert shared[0] == "checkpoint" and all(re.fullmatch(r"ckpt-(8|10|12)\.(index|data-00000-of-00001)", f) for f in shared[1:]), shared


def test_the_tf_job_runs_with_the_tf_venv_and_says_how_to_get_it(tmp_path, monkeypatch):
    import tools.emulate as em
    import tools.emulator_objects as eo

    assert em.default_python("ddp") == em.default_python("nccl-check") == sys.executable
    monkeypatch.setattr(eo, "PROJECT_DIR", str(tmp_path))  # a checkout without .venv-tf
    with pytest.raises(em.EmulationError, match="make emulate JOB=tf` creates .venv-tf"):
        em.default_python("tf")
    (tmp_path / TF_VENV / "bin").mkdir(parents=True)
    (tmp_path / TF_VENV / "bin" / "python").touch()
    assert em.default_python("tf") == str(tmp_path / TF_VENV / "bin" / "python")


def test_ddp_extra_args_may_still_say_synthetic():
    # the platform now passes --synthetic itself; a stack file that listed it keeps loading
    s = load({"trainjobs": {"ddp": {"enabled": True, "extraArgs": ["--synthetic", "--synthetic-samples", "4096"]}}})
    assert s.trainjobs.ddp.extra_args == ["--synthetic", "--synthetic-samples", "4096"]
