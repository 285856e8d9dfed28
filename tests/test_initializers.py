"""Data and models through the Trainer's initializers: the FSDP TrainJob names its dataset and model
as ``hf://`` URIs, its runtime runs the dataset and model initializer jobs before the node job,
for Trainer v2.1.0 and v2.3.0, schema-, CEL- and (as far as our objects go) webhook-valid; the
token only as a Secret reference; the emulator runs the initializer stage the same way."""

from __future__ import annotations

import json
import os
import re

import jsonschema
import pytest

from config.schema import ConfigErrors
from config.settings import load_settings
from manifests import runtimes as rt
from manifests import trainer_api
from manifests import trainjobs as tj
from tests.conftest import dev_config, objects, run_config
from tools import fixture_hub
from tools import validate as v
from tools.emulate import emulate, job_from_objects, load_job

VERSIONS = ["v2.1.0", "v2.3.0"]
RESERVED_ENV_CONTAINERS = {trainer_api.DATASET_INITIALIZER, trainer_api.MODEL_INITIALIZER, trainer_api.TRAINER_JOB}


def rendered(version: str, **trainjobs) -> tuple[dict, dict, dict]:
    """(FSDP TrainJob, its runtime, DDP TrainJob) of the dev stack on a Trainer release."""
    run = run_config(dev_config(trainer={"version": version}, trainjobs={"ddp": {"enabled": True}, "fsdp": {"enabled": True}, **trainjobs}))
    objs = list(objects(run).values())
    fsdp = next(o for o in objs if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
    ddp = next(o for o in objs if o["kind"] == "TrainJob" and o["metadata"]["name"] == "ddp-mnist")
    runtime = next(o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["name"] == fsdp["spec"]["runtimeRef"]["name"])
    return fsdp, runtime, ddp


def webhook_problems(trainjob: dict, runtime: dict, version: str) -> list[str]:
    """The Trainer webhook's checks that concern initializers (kubeflow/trainer, both releases):
    pkg/webhooks/trainingruntime_webhook.go ``validateReplicatedJobs`` (an ancestor-labelled job
    has replicas 1 and its required container) and plugins/jobset/jobset.go ``Validate`` (a
    TrainJob initializer needs that job and container, v2.3.0 also its ``initializer`` volume
    mount; overrides/patches set no env on the reserved containers)."""
    problems = []
    jobs = {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    required = {"trainer": trainer_api.TRAINER_JOB, trainer_api.DATASET_INITIALIZER: trainer_api.DATASET_INITIALIZER, trainer_api.MODEL_INITIALIZER: trainer_api.MODEL_INITIALIZER}
    for j in jobs.values():
        ancestor = j["template"].get("metadata", {}).get("labels", {}).get(rt.ANCESTOR_LABEL)
        if ancestor in required:
            if j.get("replicas", 1) != 1:
                problems.append(f"{j['name']}: replicas must be 1")
            if required[ancestor] not in {c["name"] for c in j["template"]["spec"]["template"]["spec"]["containers"]}:
                problems.append(f"{j['name']}: no container {required[ancestor]}")
    for key, name in (("dataset", trainer_api.DATASET_INITIALIZER), ("model", trainer_api.MODEL_INITIALIZER)):
        if key not in trainjob["spec"].get("initializer", {}):
            continue
        containers = {c["name"]: c for c in jobs.get(name, {}).get("template", {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])}
        if name not in containers:
            problems.append(f"initializer.{key}: runtime has no {name} job with a {name} container")
        elif version != "v2.1.0" and trainer_api.INITIALIZER_VOLUME not in {m["name"] for m in containers[name].get("volumeMounts", [])}:
            problems.append(f"initializer.{key}: {name} has no volumeMount {trainer_api.INITIALIZER_VOLUME}")
    pods = [o.get("spec", {}) for o in trainjob["spec"].get("podTemplateOverrides", [])]
    pods += [j["template"]["spec"]["template"].get("spec", {}) for p in trainjob["spec"].get("runtimePatches", []) for j in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    for pod in pods:
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            if c["name"] in RESERVED_ENV_CONTAINERS and c.get("env"):
                problems.append(f"override sets env on {c['name']}")
    return problems


@pytest.mark.parametrize("version", VERSIONS)
def test_fsdp_trainjob_initializes_dataset_and_model_before_the_node_job(need_schemas, version):
    fsdp, runtime, _ = rendered(version)
    init = fsdp["spec"]["initializer"]
    assert {k: v["storageUri"] for k, v in init.items()} == {"dataset": "hf://FiscalNote/billsum", "model": "hf://google-t5/t5-large"}
    assert init["dataset"]["env"] == init["model"]["env"] == [{"name": rt.INITIALIZED_KEY_ENV, "value": init["dataset"]["env"][0]["value"]}]
    assert runtime["metadata"]["labels"][rt.RUNTIME_LABEL] == "torch-distributed-gpu-hf"

    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["dataset-initializer", "model-initializer", "node"]  # dependsOn names earlier jobs
    assert jobs[2]["dependsOn"] == [{"name": "dataset-initializer", "status": "Complete"}, {"name": "model-initializer", "status": "Complete"}]
    for job, kind in zip(jobs[:2], ("dataset", "model"), strict=True):
        assert job["template"]["metadata"]["labels"] == {rt.ANCESTOR_LABEL: job["name"]}
        pod = job["template"]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["name"] == job["name"] and c["image"] == f"ghcr.io/kubeflow/trainer/{job['name']}:{version}"
        assert "command" not in c and "args" not in c  # the upstream image's own entrypoint
        assert not any(e["name"] == trainer_api.STORAGE_URI_ENV for e in c["env"])  # the Trainer sets it per TrainJob
        (mount,) = c["volumeMounts"]
        assert mount == {"name": "initializer", "mountPath": "/workspace", "subPathExpr": "initialized/$(TRAINJOB_NAME)/$(INITIALIZED_KEY)"}
        assert c["env"] == [{"name": "TRAINJOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}}]
        assert pod["volumes"] == [{"name": "initializer", "persistentVolumeClaim": {"claimName": "checkpoints"}}]
        assert pod["nodeSelector"] == {"training-platform/node-role": "system"} and "tolerations" not in pod  # no GPU node for a download
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and pod["automountServiceAccountToken"] is False
        assert kind in job["name"]

    # the node reads what the initializers wrote: the same claim directory through its own mount
    args = fsdp["spec"]["trainer"]["args"]
    sub_path = jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["subPathExpr"]
    here = f"/mnt/checkpoints/{sub_path.replace('$(TRAINJOB_NAME)', fsdp['metadata']['name']).replace('$(INITIALIZED_KEY)', init['model']['env'][0]['value'])}"
    assert args[args.index("--dataset-dir") + 1] == f"{here}/dataset" and args[args.index("--model-dir") + 1] == f"{here}/model"
    pod = trainer_api.read_pod_customization(fsdp["spec"])
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints"}} in pod["volumes"]
    assert {"name": "checkpoints", "mountPath": "/mnt/checkpoints"} in pod["containers"][0]["volumeMounts"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in fsdp["spec"]["trainer"]["env"]

    assert v.validate(runtime, version) == [] and v.validate(fsdp, version) == []
    jsonschema.Draft7Validator(v.jobset_schema(version)["properties"]["spec"]).validate(runtime["spec"]["template"]["spec"])
    assert webhook_problems(fsdp, runtime, version) == []


def test_webhook_rules_catch_a_runtime_without_initializers():
    fsdp, runtime, _ = rendered("v2.3.0")
    plain = rt.torch_runtime(load_settings({}, stack="dev", region="us-west-2").trainer)
    assert webhook_problems(fsdp, plain, "v2.3.0") == [f"initializer.{k}: runtime has no {k}-initializer job with a {k}-initializer container" for k in ("dataset", "model")]
    unmounted = json.loads(json.dumps(runtime))
    unmounted["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = []
    assert webhook_problems(fsdp, unmounted, "v2.3.0") == ["initializer.dataset: dataset-initializer has no volumeMount initializer"]
    assert webhook_problems(fsdp, unmounted, "v2.1.0") == []  # v2.1.0 does not check the mount


@pytest.mark.parametrize("version", VERSIONS)
def test_token_only_as_a_secret_reference(need_schemas, version):
    fsdp, runtime, ddp = rendered(version, hfTokenSecret="hf-token")
    for kind in ("dataset", "model"):
        assert fsdp["spec"]["initializer"][kind]["secretRef"] == {"name": "hf-token"}
        assert [e["name"] for e in fsdp["spec"]["initializer"][kind]["env"]] == [rt.INITIALIZED_KEY_ENV]  # no token in env
    text = json.dumps([fsdp, runtime, ddp])
    assert text.count("hf-token") == 2 and "ACCESS_TOKEN" not in text
    assert v.validate(fsdp, version) == []


def test_ddp_job_needs_no_download_and_stays_on_the_plain_runtime():
    _, _, ddp = rendered("v2.3.0")
    assert "initializer" not in ddp["spec"]
    assert re.fullmatch(r"torch-distributed-gpu-[0-9a-f]{8}", ddp["spec"]["runtimeRef"]["name"])
    args = ddp["spec"]["trainer"]["args"]
    assert "--synthetic" in args and "--data-dir" not in args


@pytest.mark.parametrize(
    ("value", "ok"),
    [("FiscalNote/billsum", True), ("hf://FiscalNote/billsum", True), ("billsum", False), ("hf://FiscalNote/billsum/data", False), ("s3://bucket/billsum", False), ("", False)],
)
def test_dataset_values(value, ok):
    raw = {"trainjobs": {"fsdp": {"dataset": value}}}
    if ok:
        s = load_settings(raw, stack="dev", region="us-west-2")
        assert s.trainjobs.fsdp.dataset_uri() == "hf://FiscalNote/billsum"
        return
    with pytest.raises(ConfigErrors) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    (problem,) = err.value.errors
    assert problem.key == "trainjobs.fsdp.dataset" and problem.value == value
    assert "allowed: a Hugging Face dataset id owner/name such as FiscalNote/billsum" in str(problem)


def test_token_secret_must_be_a_secret_name():
    with pytest.raises(ConfigErrors) as err:
        load_settings({"trainjobs": {"hfTokenSecret": "hf_token"}}, stack="dev", region="us-west-2")
    (problem,) = err.value.errors
    assert problem.key == "trainjobs.hfTokenSecret" and "allowed: the name of a Secret" in str(problem)


def test_fsdp_job_gets_the_runtime_with_initializers_even_when_the_list_leaves_it_out():
    s = load_settings({"trainer": {"runtimes": ["torch-distributed-gpu"]}, "trainjobs": {"fsdp": {"enabled": True}}}, stack="dev", region="us-west-2")
    assert s.trainer.runtimes == ["torch-distributed-gpu", "torch-distributed-gpu-hf"]


# --- the emulated initializers --------------------------------------------------------------------


def test_emulated_initializer_reads_uris_as_upstream_does(tmp_path):
    """pkg/initializers/{dataset,model}/huggingface.py: a dataset is <netloc>/<first segment>, a
    model <netloc><path>; the model keeps only json/safetensors/model/txt files."""
    assert fixture_hub.repo_id("hf://FiscalNote/billsum/extra", "dataset") == "FiscalNote/billsum"
    assert fixture_hub.repo_id("hf://google-t5/t5-large", "model") == "google-t5/t5-large"
    with pytest.raises(IndexError):
        fixture_hub.repo_id("hf://billsum", "dataset")
    hub, ws = str(tmp_path / "hub"), str(tmp_path / "ws")
    fixture_hub.build(hub, datasets=["FiscalNote/billsum"], models=["google-t5/t5-large"])
    assert fixture_hub.initialize(kind="model", uri="hf://google-t5/t5-large", hub=hub, workspace=ws) == (5, 0)
    assert sorted(os.listdir(os.path.join(ws, "model"))) == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert fixture_hub.initialize(kind="model", uri="hf://google-t5/t5-large", hub=hub, workspace=ws) == (0, 5)  # a restart copies nothing
    fixture_hub.initialize(kind="dataset", uri="hf://FiscalNote/billsum", hub=hub, workspace=ws)
    assert os.path.isfile(os.path.join(ws, "dataset", "data", "train-00000-of-00001.parquet"))


@pytest.mark.slow
def test_emulator_runs_the_initializers_then_the_job_on_their_files(tmp_path):
    job = load_job("dev", "fsdp", str(tmp_path))
    assert [i.name for i in job.init_jobs] == ["dataset-initializer", "model-initializer"]
    assert [i.env["STORAGE_URI"] for i in job.init_jobs] == ["hf://FiscalNote/billsum", "hf://google-t5/t5-large"]
    assert all(i.env["TRAINJOB_NAME"] == "fsdp-t5" for i in job.init_jobs)
    assert "--synthetic" not in job.command and "--init" not in job.command  # the real data path
    r = emulate(job, fail_node=1, fail_at_step=5, timeout_s=600, quiet=True)
    assert r["status"] == "Complete" and r["restarts"] == 1 and r["resumed_from_step"] == 4 and r["final_step"] == 12
    (key,) = {i.env[rt.INITIALIZED_KEY_ENV] for i in job.init_jobs}  # one directory for both downloads
    workspace = tmp_path / "volumes" / "checkpoints" / "initialized" / "fsdp-t5" / key
    assert (workspace / "dataset" / "data" / "train-00000-of-00001.parquet").is_file()
    assert (workspace / "model" / "model.safetensors").is_file() and not (workspace / "model" / "pytorch_model.bin").exists()


def test_without_spec_initializer_the_runtimes_initializers_fail(tmp_path):
    """Nothing drops a runtime's initializer jobs for a TrainJob without spec.initializer: they run
    with no STORAGE_URI and fail, so the JobSet fails (here with no restarts left) before any
    trainer pod starts. Hence jobs without downloads use torch-distributed-gpu."""
    fsdp, runtime, _ = rendered("v2.3.0")
    bare = {**fsdp, "spec": {k: val for k, val in fsdp["spec"].items() if k != "initializer"}}
    cm_name = trainer_api.read_pod_customization(fsdp["spec"])["volumes"][0]["configMap"]["name"]
    cm = tj.code_configmap("training", tj.code_files())
    assert cm["metadata"]["name"] == cm_name
    job = job_from_objects([bare, runtime, cm], "dev", "fsdp", str(tmp_path))
    assert "STORAGE_URI" not in job.init_jobs[0].env
    job.max_restarts = 0
    r = emulate(job, fail_node=None, fail_at_step=None, timeout_s=120, quiet=True)
    assert r["status"] == "Failed" and r["reason"] == "ReachedMaxRestarts" and "fsdp-t5-dataset-initializer-0" in r["message"]
    assert r["final_step"] is None


@pytest.mark.parametrize("version", VERSIONS)
def test_downloads_land_in_a_directory_per_dataset_and_model(version):
    """The initializers' sub-path (the runtime's subPathExpr expanded with the env the Trainer puts
    in their containers) is the directory the program is told to read; another dataset or model
    gets another directory, so a re-created job never mixes old and new files."""
    dirs = {}
    for dataset in ("FiscalNote/billsum", "hf://someone/other-sums"):
        tjob, runtime, _ = rendered(version, fsdp={"enabled": True, "dataset": dataset})
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"][:-1]:
            kind = "dataset" if rj["name"] == trainer_api.DATASET_INITIALIZER else "model"
            (container,) = rj["template"]["spec"]["template"]["spec"]["containers"]
            env = {rt.TRAINJOB_NAME_ENV: tjob["metadata"]["name"], **{e["name"]: e["value"] for e in tjob["spec"]["initializer"][kind]["env"]}}
            (mount,) = container["volumeMounts"]
            sub = re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], mount["subPathExpr"])
            args = tjob["spec"]["trainer"]["args"]
            told = args[args.index(f"--{kind}-dir") + 1]
            assert told == f"{tj.CHECKPOINT_MOUNT}/{sub}/{kind}"
        dirs[dataset] = sub
    assert len(set(dirs.values())) == 2
