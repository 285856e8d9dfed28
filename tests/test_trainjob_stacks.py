"""TrainJob stacks (workloads/): a run per stack on a platform stack read through a StackReference.

Rendered offline, a run stack registers only its run (its code ConfigMap and TrainJob, its
provider and the StackReference), built by the same function as the platform's
``trainjobs.<job>``; a run its platform cannot take is refused one line per problem with none of
its objects registered; ``make render PROJECT=workloads`` writes out/workloads/<run>/.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
import yaml

from config.run_config import RUN_PROJECT, load_run
from config.schema import ConfigErrors
from tests.conftest import PROJECT, dev_config, run_config, run_stack
from tools import render
from tools.mock_runtime import ProgramError, ProgramRun, run_program
from workloads.builders import job_platform
from workloads.builders import trainjobs as tj

WORKLOADS = PROJECT / "workloads"
DEV = "organization/training-platform/dev"
RUN_TYPES = {"pulumi:pulumi:StackReference", "training-platform:workloads:TrainJobRun", "pulumi:providers:kubernetes", "kubernetes:core/v1:ConfigMap", "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"}


def _stack(name: str) -> dict:
    return yaml.safe_load((WORKLOADS / f"Pulumi.{name}.yaml").read_text())


def _run(name: str, config: dict | None = None, outputs: dict | None = None) -> ProgramRun:
    """A run stack rendered against dev's rendered outputs (or ``outputs``)."""
    platform = outputs if outputs is not None else run_stack("dev").outputs
    return run_program(str(WORKLOADS), name, stack_config={"config": config} if config is not None else None, stack_outputs={DEV: platform})


def _refused(name: str, config: dict, outputs: dict | None = None) -> tuple[list[str], ProgramError]:
    with pytest.raises(ProgramError) as err:
        _run(name, config, outputs)
    return str(err.value).splitlines(), err.value


def _nothing_of_the_run(err: ProgramError) -> None:
    kinds = {r.type for r in err.registrations}
    assert kinds <= {"pulumi:pulumi:StackReference"}, kinds


@pytest.mark.parametrize("name", ["ddp", "fsdp", "tf"])
def test_a_run_stack_registers_only_its_run(name):
    run = _run(name)
    types = [r.type for r in run.registrations]
    assert set(types) == RUN_TYPES
    assert types.count("kubernetes:core/v1:ConfigMap") == 1 and types.count("kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob") == 1
    ref = run.one("pulumi:pulumi:StackReference")
    assert ref.inputs["name"] == DEV
    trainjob = run.one("kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob").inputs
    platform = run_stack("dev").outputs["jobPlatform"]
    key = next(iter(k for k in _stack(name)["config"] if k != f"{RUN_PROJECT}:platform")).split(":")[1]
    assert trainjob["metadata"]["name"] == f"{tj.WORKLOADS[key].name}-{name}"  # never the platform's own job
    assert trainjob["metadata"]["namespace"] == platform["namespace"]
    assert trainjob["spec"]["runtimeRef"]["name"] in platform["runtimes"].values()
    assert run.outputs["trainJob"] == trainjob["metadata"]["name"]


def test_the_platform_exports_what_a_run_needs():
    doc = run_stack("dev").outputs["jobPlatform"]
    facts = job_platform.from_document(doc, DEV)
    assert facts.namespace == "training" and facts.trainer_version == "v2.3.0" and facts.queue is None  # dev: no tenants, Kueue off
    assert {"torch-distributed-gpu", "torch-distributed-gpu-hf", "tensorflow-distributed"} <= set(facts.runtime_names)
    assert facts.image and "@sha256:" in facts.image
    assert "g5.12xlarge" in facts.pools[0].instance_types
    assert "kubeconfig" in run_stack("dev").outputs


def test_the_run_is_what_the_platform_toggle_renders_for_the_same_settings():
    """One builder: the platform's trainjobs.fsdp and a run stack with the same settings differ
    only in the run's name (its own job, its own checkpoints)."""
    settings = {"numNodes": 2, "instanceType": "g5.12xlarge", "epochs": 2, "model": "google-t5/t5-small"}
    platform = run_config(dev_config(trainjobs={"fsdp": {"enabled": True, **settings}}))
    theirs = next(o for o in render.manifests(platform).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
    run = _run("fsdp", {f"{RUN_PROJECT}:platform": DEV, f"{RUN_PROJECT}:fsdp": settings}, platform.outputs)
    ours = next(o for o in render.manifests(run).values() if o["kind"] == "TrainJob")
    assert ours["metadata"]["name"] == "fsdp-t5-fsdp"
    # its own code ConfigMap (ended with the run), with the platform's code
    code = next(o for o in render.manifests(run).values() if o["kind"] == "ConfigMap")
    their_code = next(o for o in render.manifests(platform).values() if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("training-code-"))
    assert code["metadata"]["name"] == their_code["metadata"]["name"].replace("training-code-", "fsdp-t5-fsdp-code-")
    assert {k: v for k, v in code.items() if k != "metadata"} == {k: v for k, v in their_code.items() if k != "metadata"}
    renamed = json.dumps(theirs).replace("fsdp-t5", "fsdp-t5-fsdp").replace(their_code["metadata"]["name"], code["metadata"]["name"])
    assert json.loads(renamed) == ours


def _cfg(**job) -> dict:
    return {f"{RUN_PROJECT}:platform": DEV, f"{RUN_PROJECT}:fsdp": {"numNodes": 2, "instanceType": "g5.12xlarge", **job}}


def test_a_runtime_the_platform_lacks_is_refused():
    lines, err = _refused("fsdp", _cfg(terminationGraceSeconds=300))
    assert len(lines) == 1 and "has no runtime torch-distributed-gpu-hf-grace300" in lines[0] and "fsdp.terminationGraceSeconds" in lines[0]
    _nothing_of_the_run(err)


def test_an_instance_type_outside_the_pool_and_a_priority_without_kueue_each_one_line():
    doc = copy.deepcopy(run_stack("dev").outputs)
    doc["jobPlatform"]["pools"][0]["instanceTypes"] = ["g5.xlarge", "g5.2xlarge"]
    lines, err = _refused("fsdp", _cfg(priority="high"), doc)
    assert len(lines) == 2, lines
    assert any(f"{RUN_PROJECT}:fsdp.instanceType = 'g5.12xlarge': not allowed by the gpu-pool" in line and "g5.2xlarge, g5.xlarge" in line for line in lines)
    assert any(f"{RUN_PROJECT}:fsdp.priority = 'high': Kueue is off" in line for line in lines)
    _nothing_of_the_run(err)


def test_an_efa_zone_mismatch_is_refused():
    doc = copy.deepcopy(run_stack("dev").outputs)
    doc["jobPlatform"]["efa"] = {"zone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}
    doc["jobPlatform"]["pools"].append({"name": "gpu-efa", "instanceTypes": ["p5.48xlarge"], "gpuLimit": 16, "efa": True})
    lines, err = _refused("fsdp", _cfg(instanceType="p5.48xlarge", availabilityZone="us-west-2b"), doc)
    assert len(lines) == 1 and "fsdp.availabilityZone = 'us-west-2b'" in lines[0] and "allowed: efa.availabilityZone (us-west-2a)" in lines[0]
    _nothing_of_the_run(err)
    ok = _run("fsdp", _cfg(instanceType="p5.48xlarge", availabilityZone="us-west-2a"), doc)
    selector = tj.trainer_api.read_pod_customization(ok.one("kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob").inputs["spec"])["nodeSelector"]
    assert selector["training-platform/pool"] == "gpu-efa" and selector["topology.kubernetes.io/zone"] == "us-west-2a"


def test_unknown_keys_and_bad_values_are_refused_one_line_each():
    lines, err = _refused("fsdp", {**_cfg(numNodez=2, epochs=0), f"{RUN_PROJECT}:platfrom": DEV})
    assert len(lines) == 3, lines
    assert any(f"{RUN_PROJECT}:platfrom" in line and "did you mean 'platform'" in line for line in lines)
    assert any(f"{RUN_PROJECT}:fsdp.numNodez" in line and "unknown key" in line for line in lines)
    assert any(f"{RUN_PROJECT}:fsdp.epochs = 0" in line for line in lines)
    assert err.registrations == []  # refused before the StackReference


def test_load_run_rules():
    names = {k: w.name for k, w in tj.WORKLOADS.items()}
    with pytest.raises(ConfigErrors) as err:
        load_run({"platform": "dev", "ddp": {"enabled": True}, "tf": {}}, stack="Big_Run", base_names=names)
    keys = err.value.keys
    assert f"{RUN_PROJECT}:platform" in keys and f"{RUN_PROJECT}:ddp, tf" in keys
    with pytest.raises(ConfigErrors) as err:
        load_run({"platform": DEV, "ddp": {"enabled": False, "extraArgs": ["--epochs", "3"]}}, stack="Big_Run", base_names=names)
    assert set(err.value.keys) == {f"{RUN_PROJECT}:ddp.enabled", f"{RUN_PROJECT}:ddp.extraArgs[0]", "pulumi:stack"}
    run = load_run({"platform": DEV, "ddp": {"numNodes": 3}}, stack="nightly", base_names=names)
    assert (run.key, run.name, run.job.num_nodes) == ("ddp", "ddp-mnist-nightly", 3)


def test_render_project_workloads_writes_the_run_and_its_platform_first(tmp_path):
    assert render.main(["--project", "workloads", "--stack", "fsdp", "--out", str(tmp_path)]) == 0
    d = tmp_path / "workloads" / "fsdp"
    files = sorted(p.name for p in (d / "manifests").iterdir())
    assert len(files) == 2 and files[0].startswith("configmap-training-fsdp-t5-fsdp-code-") and files[1] == "trainjob-training-fsdp-t5-fsdp.yaml"
    plan = json.loads((d / "plan.json").read_text())
    assert {r["type"] for r in plan["resources"]} == RUN_TYPES
    assert (d / "platform" / "plan.json").is_file() and (d / "platform" / "manifests" / "trainjob-training-fsdp-t5.yaml").is_file()


def test_trainctl_builds_from_the_job_model_without_a_stand_in_settings():
    source = "\n".join(p.read_text() for p in pathlib.Path(PROJECT / "trainctl").rglob("*.py"))
    assert "model_construct" not in source
    assert "run_objects(" in (PROJECT / "trainctl" / "objects.py").read_text()


def test_a_trainer_without_a_field_the_run_sets_and_a_platform_without_an_image():
    doc = copy.deepcopy(run_stack("dev").outputs["jobPlatform"])
    doc.update(trainerVersion="v2.1.0", image=None)
    platform = job_platform.from_document(doc, DEV)
    run = load_run({"platform": DEV, "ddp": {"activeDeadlineSeconds": 7200}}, stack="nightly", base_names={k: w.name for k, w in tj.WORKLOADS.items()})
    lines = [str(e) for e in job_platform.run_problems(run.path(), run.job, platform)]
    assert len(lines) == 2, lines
    assert any("ddp.activeDeadlineSeconds = 7200: Trainer v2.1.0's TrainJob has no activeDeadlineSeconds" in line for line in lines)
    assert any("ddp.image = None" in line and "built no training image" in line for line in lines)
    with pytest.raises(job_platform.DocumentError, match="exports no jobPlatform output"):
        job_platform.from_document(None, DEV)
