"""The time a training pod has between SIGTERM and SIGKILL (preemption, a drain, a spot
interruption) to finish its step and save: set on every runtime, per job through the runtime's
grace variant (never in the TrainJob, where Kueue's admission would drop it), told to the
programs, which say when their checkpoint does not fit, and kept by the emulator. And the class:
every field our builders and trainctl put in a TrainJob is one Kueue's admission keeps."""

from __future__ import annotations

import copy
import json
import pathlib
import sys
import typing
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel

from config.infra_models import TrainerSettings
from config.settings import ConfigError, load_settings
from k8s.builders import runtimes as rt
from k8s.builders import trainer_api
from k8s.builders.runtimes import GRACE_ENV
from tests.conftest import dev_config, objects, run_config, stack_file
from tools import emulate
from tools import validate as v
from trainctl import code
from trainctl import objects as objects_

PROGRAMS = pathlib.Path(__file__).resolve().parent.parent / "workloads" / "programs"  # a code directory with python files


def _trainer_pod(obj: dict) -> dict:
    return next(j for j in obj["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")["template"]["spec"]["template"]["spec"]


def test_every_runtime_gives_its_pods_the_stacks_grace_period_and_says_it_in_their_env():
    run = run_config(dev_config(trainer={"terminationGraceSeconds": 300}))
    runtimes = [o for o in objects(run).values() if o["kind"] == "ClusterTrainingRuntime"]
    assert runtimes
    for runtime in runtimes:
        pod = _trainer_pod(runtime)
        assert pod["terminationGracePeriodSeconds"] == 300, runtime["metadata"]["name"]
        assert {"name": GRACE_ENV, "value": "300"} in pod["containers"][0]["env"]
    default = run_config(dev_config())
    assert {_trainer_pod(o)["terminationGracePeriodSeconds"] for o in objects(default).values() if o["kind"] == "ClusterTrainingRuntime"} == {120}


def _runtime_of(objs: list[dict], trainjob: dict) -> dict:
    return next(o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["name"] == trainjob["spec"]["runtimeRef"]["name"])


@pytest.mark.parametrize("version", ["v2.1.0", "v2.3.0"])
def test_a_job_with_its_own_grace_period_runs_on_its_runtimes_variant_with_it(version):
    """The grace period is the runtime's, never the TrainJob's (Kueue drops it from a pod patch), so
    it holds on either Trainer release; the other jobs stay on the base runtimes."""
    run = run_config(dev_config(trainer={"version": version}, trainjobs={"ddp": {"enabled": True}, "fsdp": {"enabled": True, "terminationGraceSeconds": 600}}))
    objs = list(objects(run).values())
    fsdp = next(o for o in objs if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
    runtime = _runtime_of(objs, fsdp)
    labels = runtime["metadata"]["labels"]
    assert (labels[rt.RUNTIME_LABEL], labels[rt.FAMILY_LABEL], labels[rt.GRACE_LABEL]) == ("torch-distributed-gpu-hf-grace600", "torch-distributed-gpu-hf", "600")
    assert runtime["metadata"]["name"].startswith("torch-distributed-gpu-hf-grace600-")
    pod = _trainer_pod(runtime)
    assert pod["terminationGracePeriodSeconds"] == 600 and {"name": GRACE_ENV, "value": "600"} in pod["containers"][0]["env"]
    # nothing of it in the TrainJob: no pod patch field, no env entry
    assert "terminationGracePeriodSeconds" not in json.dumps(fsdp["spec"]) and GRACE_ENV not in json.dumps(fsdp["spec"])
    ddp = next(o for o in objs if o["kind"] == "TrainJob" and o["metadata"]["name"] == "ddp-mnist")
    assert _runtime_of(objs, ddp)["metadata"]["labels"][rt.GRACE_LABEL] == "120"
    # the variant differs from its base in mutable parts only: the same content hash
    base = next(o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["labels"][rt.RUNTIME_LABEL] == "torch-distributed-gpu-hf")
    assert runtime["metadata"]["name"].rsplit("-", 1)[1] == base["metadata"]["name"].rsplit("-", 1)[1]
    assert v.validate(runtime, version) == [] and v.validate(fsdp, version) == []


def test_the_platform_offers_grace_classes_as_variants_of_every_runtime():
    run = run_config(dev_config(trainer={"graceClasses": [300, 900]}))
    runtimes = [o for o in objects(run).values() if o["kind"] == "ClusterTrainingRuntime"]
    by_family: dict[str, set[str]] = {}
    for o in runtimes:
        labels = o["metadata"]["labels"]
        by_family.setdefault(labels[rt.FAMILY_LABEL], set()).add(labels[rt.GRACE_LABEL])
        assert str(_trainer_pod(o)["terminationGracePeriodSeconds"]) == labels[rt.GRACE_LABEL]
    assert by_family == {base: {"120", "300", "900"} for base in rt.BUILDERS}
    assert len({o["metadata"]["name"] for o in runtimes}) == len(runtimes) == 12


@pytest.mark.parametrize("raw,line", [
    ({"trainer": {"terminationGraceSeconds": 5}}, "trainer.terminationGraceSeconds = 5: allowed: an integer from 30 to 3600"),
    ({"trainjobs": {"ddp": {"enabled": True, "terminationGraceSeconds": 7200}}}, "trainjobs.ddp.terminationGraceSeconds = 7200: allowed: an integer from 30 to 3600"),
    ({"trainer": {"graceClasses": [600, 20]}}, "trainer.graceClasses[1] = 20: allowed: an integer from 30 to 3600, once, other than trainer.terminationGraceSeconds (120"),
    ({"trainer": {"graceClasses": [120]}}, "trainer.graceClasses[0] = 120: allowed"),
    ({"trainer": {"graceClasses": [600, 600]}}, "trainer.graceClasses[1] = 600: allowed"),
])
def test_grace_periods_the_platform_cannot_keep_are_refused(raw, line):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert any(line in problem for problem in str(err.value).splitlines()), str(err.value)


# --- trainctl --grace-seconds: a variant the platform published ----------------------------------


def _cluster_runtime(base: str, grace: int, *, default: int = 120, created: str = "2026-11-01T00:00:00Z", deleting: bool = False) -> dict:
    settings = TrainerSettings(termination_grace_seconds=default)
    obj = rt.BUILDERS[base](settings, grace)
    obj["metadata"]["creationTimestamp"] = created
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-11-02T00:00:00Z"
    return obj


def _request(grace: int | None, runtime: str = "torch") -> objects_.Request:
    return objects_.Request(namespace="vision", nodes=2, command=["python", "train.py"], runtime=runtime, grace_seconds=grace)


def test_trainctl_picks_the_published_variant_with_the_grace_period_asked_for():
    found = [_cluster_runtime("torch-distributed-gpu", 120), _cluster_runtime("torch-distributed-gpu", 600),
             _cluster_runtime("torch-distributed-gpu", 600, created="2026-11-03T00:00:00Z"), _cluster_runtime("torch-distributed-gpu", 900, deleting=True)]
    found[2]["metadata"]["name"] += "x"  # a newer one of the same variant
    assert objects_.runtime_for(_request(600), found) == found[2]["metadata"]["name"]
    assert objects_.runtime_for(_request(120), found) == found[0]["metadata"]["name"]
    with pytest.raises(objects_.SubmitError) as err:
        objects_.runtime_for(_request(900), found)  # the only 900 is being deleted
    assert str(err.value) == "--grace-seconds 900: this cluster's torch-distributed-gpu runtimes offer 120 (the default), 600; allowed: one of them (the platform adds others with trainer.graceClasses)"
    with pytest.raises(objects_.SubmitError) as err:
        objects_.runtime_for(_request(600, runtime="tensorflow"), found)
    assert str(err.value).startswith("--grace-seconds 600: this cluster's tensorflow-distributed runtimes offer none;")


def test_a_trainctl_job_with_a_grace_period_carries_none_of_it_in_the_trainjob():
    req = objects_.Request(namespace="vision", nodes=2, command=["python", "launch.py"], grace_seconds=600, runtime_name="torch-distributed-gpu-grace600-01234567")
    _, job = objects_.build(req, code.collect(PROGRAMS))
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed-gpu-grace600-01234567"
    assert "terminationGracePeriodSeconds" not in json.dumps(job) and GRACE_ENV not in json.dumps(job)
    # without a cluster to ask, the name the platform gives that variant by default
    _, job = objects_.build(replace(req, runtime_name=None), code.collect(PROGRAMS))
    assert job["spec"]["runtimeRef"]["name"] == rt.torch_runtime(TrainerSettings(), 600)["metadata"]["name"]


# --- every field we put in a TrainJob survives Kueue's admission ---------------------------------


def _model_unknown(model: type[BaseModel], obj: Any, path: str) -> list[str]:
    """Paths in ``obj`` that the pydantic model (kubeflow-trainer-api 2.3.0: the v2.3.0 TrainJob
    and the Kubernetes types it embeds) has no field for."""
    if isinstance(obj, list):
        return [p for item in obj for p in _model_unknown(model, item, f"{path}[]")]
    if not isinstance(obj, dict):
        return []
    fields = {(f.alias or name): f.annotation for name, f in model.model_fields.items()}
    unknown = []
    for key, value in obj.items():
        if key not in fields:
            unknown.append(f"{path}.{key}".lstrip("."))
            continue
        target = _model_of(fields[key])
        if target is not None:
            unknown += _model_unknown(target, value, f"{path}.{key}")
    return unknown


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (through Optional, List and Dict values), or None for a scalar."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is dict:
        return None  # a map of names to scalars (labels, nodeSelector, resources)
    for a in args:
        found = _model_of(a)
        if found is not None:
            return found
    return None


def _trainjobs() -> list[tuple[str, dict]]:
    """Every TrainJob our builders make for a queue: the teams stack's (Kueue on), with grace
    periods and EFA, and trainctl's with every flag."""
    found = []
    teams = stack_file("teams")["config"]
    teams["training-platform:trainjobs"]["ddp"]["terminationGraceSeconds"] = 600
    teams["training-platform:trainjobs"]["fsdp"]["terminationGraceSeconds"] = 900
    teams["training-platform:trainjobs"]["fsdp"]["activeDeadlineSeconds"] = 86400
    for o in objects(run_config(teams, stack="teams")).values():
        if o["kind"] == "TrainJob":
            found.append((f"teams/{o['metadata']['name']}", o))
    for runtime in objects_.RUNTIMES:
        req = objects_.Request(
            namespace="vision", nodes=2, command=["python", "launch.py"], runtime=runtime, gpus_per_node=4, instance_type="p5.48xlarge", image="repo/img:1",
            name=f"all-flags-{runtime}", efa_zone="us-west-2a", efa_types=("p5.48xlarge",), priority="high", grace_seconds=600, runtime_name="r-1",
        )
        found.append((f"trainctl/{runtime}", objects_.build(req, code.collect(PROGRAMS))[1]))
    return found


def test_every_field_of_our_trainjobs_is_a_v2_3_field_that_kueues_types_keep():
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    jobs = _trainjobs()
    assert {name.split("/")[0] for name, _ in jobs} == {"teams", "trainctl"} and len(jobs) >= 4
    for name, job in jobs:
        assert job["metadata"]["labels"].get("kueue.x-k8s.io/queue-name"), name  # all of them queued
        assert _model_unknown(TrainerV1alpha1TrainJob, job, "") == [], name
        assert trainer_api.dropped_by_kueue(job) == [], name
        # what the job set: grace period (in its runtime), env, volumes, node selector, resources
        assert {"spec.trainer.env", "spec.trainer.resourcesPerNode", "spec.runtimePatches"} <= trainer_api.field_paths(job), name


def test_kueues_dropped_fields_are_caught():
    """The check can fail: a pod patch with the grace period (what the platform sent before) is
    named, and the builder refuses to emit one for a queued job."""
    job = copy.deepcopy(_trainjobs()[0][1])
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    patch["terminationGracePeriodSeconds"] = 600
    assert trainer_api.dropped_by_kueue(job) == list(trainer_api.KUEUE_DROPPED_FIELDS)
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    assert _model_unknown(TrainerV1alpha1TrainJob, job, "") == []  # a v2.3.0 field all the same: only Kueue drops it
    assert _model_unknown(TrainerV1alpha1TrainJob, {"spec": {"trainer": {"envv": []}}}, "") == ["spec.trainer.envv"]


def test_the_builder_refuses_a_queued_trainjob_with_a_field_kueue_drops(monkeypatch):
    real = trainer_api.pod_customization

    def with_grace(version, *, metadata, pod_spec, job_metadata=None):
        return real(version, metadata=metadata, pod_spec={**pod_spec, "terminationGracePeriodSeconds": 600}, job_metadata=job_metadata)

    monkeypatch.setattr(trainer_api, "pod_customization", with_grace)
    req = objects_.Request(namespace="vision", nodes=2, command=["python", "launch.py"], runtime_name="r-1")
    with pytest.raises(ValueError, match="Kueue's Trainer v2.2.1 types drop spec.runtimePatches.*terminationGracePeriodSeconds at admission"):
        objects_.build(req, code.collect(PROGRAMS))
    objects_.build(replace(req, queue=None), code.collect(PROGRAMS))  # no queue, no Kueue: nothing dropped


def test_the_program_says_once_when_its_checkpoint_does_not_fit_the_grace_period(monkeypatch, capsys):
    import trainlib

    monkeypatch.setenv(GRACE_ENV, "60")
    monkeypatch.setattr(trainlib, "_grace_warned", [])
    trainlib._check_grace({"step": 10, "ckpt_total_s": 20.0})  # fits
    assert capsys.readouterr().err == ""
    trainlib._check_grace({"step": 20, "ckpt_total_s": 45.0})
    trainlib._check_grace({"step": 30, "ckpt_total_s": 50.0})
    err = capsys.readouterr().err
    assert err.count("checkpoint: saving step 20 took 45 s, more than half the pod's grace period (60 s)") == 1
    assert "terminationGraceSeconds" in err and "step 30" not in err


def test_the_emulator_kills_a_node_that_outstays_its_grace_period():
    """SIGTERM, then the pod's grace period, then SIGKILL (exit 137), as from the kubelet."""
    ignores = [sys.executable, "-c", f"import time; print({emulate.SIGTERM_LINE!r}, flush=True); time.sleep(60)"]
    leaves = [sys.executable, "-c", "import time; time.sleep(60)"]
    env = {"PATH": "/usr/bin:/bin", GRACE_ENV: "1"}
    result = emulate._run_pods([(ignores, env), (leaves, env)], ["j-node-0-0", "j-node-0-1"], "node", timeout_s=30, quiet=True)
    assert [(f.pod, f.exit_code) for f in result.failed] == [("j-node-0-0", 137)]


def test_a_local_run_with_grace_seconds_gets_the_variant_the_platform_would_render(tmp_path, capsys):
    """``trainctl submit --local --grace-seconds``: the emulator renders the stack with that grace
    class when the stack offers none, so the nodes get the job's grace period."""
    import yaml

    from tools import emulator_objects

    req = objects_.Request(namespace="local", nodes=2, command=["python", "launch.py"], gpus_per_node=1, grace_seconds=600)
    cm, job = objects_.build(req, code.collect(PROGRAMS))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump_all([cm, job]))
    local = emulator_objects.load_trainjob_file(str(tmp_path / "job.yaml"), "dev", str(tmp_path / "work"))
    assert local.env[GRACE_ENV] == "600"
    assert "note:" not in capsys.readouterr().out  # the name it references is the one rendered
