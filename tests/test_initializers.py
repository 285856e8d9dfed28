"""Data and models through the Trainer's initializers: the FSDP TrainJob names its dataset and model
as ``hf://`` URIs, its runtime runs the dataset and model initializer jobs before the node job,
for Trainer v2.1.0 and v2.3.0, schema-, CEL- and (as far as our objects go) webhook-valid; the
token only as a Secret reference; the emulator runs the initializer stage the same way."""

from __future__ import annotations

import json
import os
import re

import pytest

from config.schema import ConfigErrors
from config.settings import load_settings
from k8s.builders import runtimes as rt
from k8s.builders import trainer_api
from tests.conftest import dev_config, objects, run_config, stack_file
from tools import fixture_hub
from tools import validate as v
from tools.emulate import emulate, job_from_objects, load_job
from workloads.builders import trainjobs as tj

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
        workspace, scratch = c["volumeMounts"]
        assert workspace == {"name": "initializer", "mountPath": "/workspace", "subPathExpr": "initialized/$(TRAINJOB_NAME)/$(INITIALIZED_KEY)"}
        assert scratch == {"name": rt.SCRATCH_VOLUME, "mountPath": "/tmp"}
        assert c["env"] == [
            {"name": "TRAINJOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}},
            {"name": "INITIALIZED_KEY", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{rt.INITIALIZED_KEY_ANNOTATION}']"}}},
            {"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/huggingface"},  # writable for the non-root user
        ]
        assert pod["volumes"] == [{"name": "initializer", "persistentVolumeClaim": {"claimName": "checkpoints"}}, {"name": rt.SCRATCH_VOLUME, "emptyDir": {}}]
        assert pod["nodeSelector"] == {"training-platform/node-role": "system"} and "tolerations" not in pod  # no GPU node for a download
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        # the init container makes the sub-path directory as that user, through the claim's root
        (setup,) = pod["initContainers"]
        assert setup["image"] == c["image"] and setup["volumeMounts"] == [{"name": "initializer", "mountPath": rt.CLAIM_ROOT_MOUNT}]
        assert setup["env"] == c["env"][:2] and setup["command"][:2] == ["python", "-c"]
        assert kind in job["name"]
    # the key reaches the initializer pods as the annotation their init container reads
    key = init["dataset"]["env"][0]["value"]
    patched = tj.initializer_pod_metadata(init)
    assert patched == {name: {"annotations": {rt.INITIALIZED_KEY_ANNOTATION: key}} for name in ("dataset-initializer", "model-initializer")}
    if version == "v2.1.0":
        assert [{"targetJobs": o["targetJobs"], "metadata": o["metadata"]} for o in fsdp["spec"]["podTemplateOverrides"][1:]] == [
            {"targetJobs": [{"name": n}], "metadata": md} for n, md in sorted(patched.items())]
    else:
        (patch,) = fsdp["spec"]["runtimePatches"]
        assert [j for j in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] if j["name"] != "node"] == [
            {"name": n, "template": {"spec": {"template": {"metadata": md}}}} for n, md in sorted(patched.items())]

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
    dirs, sub = {}, ""
    for dataset in ("FiscalNote/billsum", "hf://someone/other-sums"):
        tjob, runtime, _ = rendered(version, fsdp={"enabled": True, "dataset": dataset})
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"][:-1]:
            kind = "dataset" if rj["name"] == trainer_api.DATASET_INITIALIZER else "model"
            (container,) = rj["template"]["spec"]["template"]["spec"]["containers"]
            env = {rt.TRAINJOB_NAME_ENV: tjob["metadata"]["name"], **{e["name"]: e["value"] for e in tjob["spec"]["initializer"][kind]["env"]}}
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == trainer_api.INITIALIZER_WORKSPACE]
            sub = re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], mount["subPathExpr"])
            args = tjob["spec"]["trainer"]["args"]
            told = args[args.index(f"--{kind}-dir") + 1]
            assert told == f"{tj.CHECKPOINT_MOUNT}/{sub}/{kind}"
        dirs[dataset] = sub
    assert len(set(dirs.values())) == 2


# --- every pod a team's job can create passes Pod Security "restricted" ---------------------------
# The rules as k8s.io/pod-security-admission v0.34.4 states them (policy/check_*.go, the text the
# Pod Security Standards page documents; Kubernetes 1.34, the clusters' version): baseline, then
# what restricted adds. Each line names the check it comes from.
_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}  # check_capabilities_baseline.go
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
                 "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
                 "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}  # check_sysctls.go (1.32+)
_RESTRICTED_VOLUMES = {"configMap", "downwardAPI", "emptyDir", "projected", "secret", "csi", "persistentVolumeClaim", "ephemeral", "image"}  # check_restrictedVolumes.go
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}  # check_seLinuxOptions.go


def restricted_violations(pod: dict) -> list[str]:
    """What Pod Security ``restricted`` refuses in a pod spec, one line per rule broken."""
    found = []
    psc = pod.get("securityContext") or {}
    containers = [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]
    scs = [(c["name"], c.get("securityContext") or {}) for c in containers]
    for field in ("hostNetwork", "hostPID", "hostIPC"):  # check_hostNamespaces.go
        if pod.get(field):
            found.append(f"{field}: must be false")
    if psc.get("windowsOptions", {}).get("hostProcess") or any(sc.get("windowsOptions", {}).get("hostProcess") for _, sc in scs):  # check_windowsHostProcess.go
        found.append("windowsOptions.hostProcess: must be false")
    for name, sc in scs:
        if sc.get("privileged"):  # check_privileged.go
            found.append(f"{name}: privileged")
        added = set(sc.get("capabilities", {}).get("add", []))
        if added - _BASELINE_CAPS:  # check_capabilities_baseline.go
            found.append(f"{name}: capabilities.add {sorted(added - _BASELINE_CAPS)}")
        if added - {"NET_BIND_SERVICE"}:  # check_capabilities_restricted.go
            found.append(f"{name}: capabilities.add may hold only NET_BIND_SERVICE")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):  # check_capabilities_restricted.go
            found.append(f"{name}: capabilities.drop must include ALL")
        if sc.get("allowPrivilegeEscalation") is not False:  # check_allowPrivilegeEscalation.go: must be false
            found.append(f"{name}: allowPrivilegeEscalation must be false")
        if sc.get("procMount", "Default") != "Default":  # check_procMount.go
            found.append(f"{name}: procMount")
        if sc.get("appArmorProfile", {}).get("type", "RuntimeDefault") not in ("RuntimeDefault", "Localhost"):  # check_appArmorProfile.go
            found.append(f"{name}: appArmorProfile")
        if sc.get("runAsNonRoot") is False:  # check_runAsNonRoot.go
            found.append(f"{name}: runAsNonRoot false")
        if sc.get("runAsUser") == 0:  # check_runAsUser.go
            found.append(f"{name}: runAsUser 0")
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":  # check_seccompProfile_baseline.go
            found.append(f"{name}: seccompProfile Unconfined")
        for port in c_ports(containers, name):  # check_hostPorts.go
            if port.get("hostPort"):
                found.append(f"{name}: hostPort")
        for level, opts in (("container", sc.get("seLinuxOptions") or {}),):  # check_seLinuxOptions.go
            if opts.get("type", "") not in _SELINUX_TYPES or opts.get("user") or opts.get("role"):
                found.append(f"{name}: {level} seLinuxOptions")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):  # check_hostProbesAndhostLifecycle.go
            if (next(c for c in containers if c["name"] == name).get(probe) or {}).get("httpGet", {}).get("host"):
                found.append(f"{name}: {probe}.httpGet.host")
    if not psc.get("runAsNonRoot") and not all(sc.get("runAsNonRoot") for _, sc in scs):  # check_runAsNonRoot.go
        found.append("runAsNonRoot: must be true for the pod or every container")
    if psc.get("runAsUser") == 0:  # check_runAsUser.go
        found.append("securityContext.runAsUser 0")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    if pod_seccomp == "Unconfined" or (pod_seccomp not in ("RuntimeDefault", "Localhost") and not all(sc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost") for _, sc in scs)):
        found.append("seccompProfile: RuntimeDefault or Localhost for the pod or every container")  # check_seccompProfile_restricted.go
    if (psc.get("seLinuxOptions") or {}).get("type", "") not in _SELINUX_TYPES:
        found.append("securityContext.seLinuxOptions")
    for s in psc.get("sysctls", []):  # check_sysctls.go
        if s["name"] not in _SAFE_SYSCTLS:
            found.append(f"sysctl {s['name']}")
    for vol in pod.get("volumes", []):  # check_hostPathVolumes.go, check_restrictedVolumes.go
        kinds = set(vol) - {"name"}
        if kinds - _RESTRICTED_VOLUMES:
            found.append(f"volume {vol['name']}: {sorted(kinds - _RESTRICTED_VOLUMES)}")
    return found


def c_ports(containers: list[dict], name: str) -> list[dict]:
    return next(c for c in containers if c["name"] == name).get("ports", [])


def _teams_objects(version: str) -> list[dict]:
    """The teams stack's objects on a Trainer release, with a grace class and a job grace period
    (so the variants are among the runtimes a team can name)."""
    config = stack_file("teams")["config"]
    config["training-platform:trainer"] = {**config["training-platform:trainer"], "version": version, "graceClasses": [600]}
    if version == "v2.1.0":  # Kueue needs Trainer v2.2+ (config refuses it on v2.1.0)
        config.pop("training-platform:kueue", None)
        config["training-platform:tenants"] = {k: {**v, "queueing": False} if isinstance(v, dict) else v for k, v in config["training-platform:tenants"].items()} if False else config["training-platform:tenants"]
    config["training-platform:trainjobs"]["ddp"]["terminationGraceSeconds"] = 900
    return list(objects(run_config(config, stack="teams")).values())


@pytest.mark.parametrize("version", VERSIONS)
def test_every_pod_of_every_runtime_a_team_can_name_passes_restricted(version):
    from tools.effective_pods import effective_job
    from trainctl import code
    from trainctl import objects as trainctl_objects

    objs = _teams_objects(version)
    runtimes = [o for o in objs if o["kind"] == "ClusterTrainingRuntime"]
    families = {o["metadata"]["labels"][rt.FAMILY_LABEL] for o in runtimes}
    assert families == set(rt.BUILDERS) and len(runtimes) >= 2 * len(families)  # each with its grace variants
    for runtime in runtimes:
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            assert restricted_violations(rj["template"]["spec"]["template"]["spec"]) == [], (runtime["metadata"]["name"], rj["name"])
    # a team's own job (trainctl, every runtime it names) as its pods will be: runtime and TrainJob merged
    programs = tj.PROGRAMS_DIR
    for name, base in trainctl_objects.RUNTIMES.items():
        runtime = next(o for o in runtimes if o["metadata"]["labels"][rt.RUNTIME_LABEL] == base)
        req = trainctl_objects.Request(namespace="vision", nodes=2, command=["python", "launch.py"], runtime=name, runtime_name=runtime["metadata"]["name"], trainer_version=version)
        _, job = trainctl_objects.build(req, code.collect(programs))
        assert restricted_violations(effective_job(job, runtime)["spec"]["template"]["spec"]) == [], name


def test_the_restricted_check_refuses_what_the_profile_refuses():
    """It can fail: the initializer pod as it was (no runAsNonRoot: issue 32), and each rule once."""
    pod = json.loads(json.dumps(rt.initializer_job(kind="dataset", image="i:1")["template"]["spec"]["template"]["spec"]))
    assert restricted_violations(pod) == []
    before = json.loads(json.dumps(pod))
    before["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    assert restricted_violations(before) == ["runAsNonRoot: must be true for the pod or every container"]
    broken = json.loads(json.dumps(pod))
    broken["hostNetwork"] = True
    broken["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    broken["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    broken["securityContext"]["runAsUser"] = 0
    assert restricted_violations(broken) == [
        "hostNetwork: must be false", "dataset-initializer: capabilities.add ['SYS_ADMIN']", "dataset-initializer: capabilities.add may hold only NET_BIND_SERVICE",
        "dataset-initializer: capabilities.drop must include ALL", "dataset-initializer: allowPrivilegeEscalation must be false", "securityContext.runAsUser 0", "volume host: ['hostPath']",
    ]


def test_workspace_setup_makes_the_directory_or_says_in_one_line_why_not(tmp_path):
    """The init container's program, run here as it runs in the pod (the claim's root at
    CLAIM_ROOT_MOUNT): the directory for the TrainJob and key, made again without complaint; a
    tree the user may not write gives one line and a non-zero exit."""
    import subprocess
    import sys

    root = tmp_path / "claim"
    root.mkdir()
    script = rt.WORKSPACE_SETUP_SCRIPT.replace(repr(rt.CLAIM_ROOT_MOUNT), repr(str(root)))
    env = {"PATH": "/usr/bin:/bin", rt.TRAINJOB_NAME_ENV: "fsdp-t5", rt.INITIALIZED_KEY_ENV: "abc123"}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    assert (root / "initialized" / "fsdp-t5" / "abc123").is_dir()
    done = subprocess.run([sys.executable, "-c", script], env={**env, rt.INITIALIZED_KEY_ENV: ""}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and (root / "initialized" / "fsdp-t5").is_dir()  # no key (a team's own job): the job's directory
    (root / "initialized").chmod(0o555)
    try:
        done = subprocess.run([sys.executable, "-c", script], env={**env, rt.TRAINJOB_NAME_ENV: "other"}, capture_output=True, text=True, timeout=30)
    finally:
        (root / "initialized").chmod(0o755)
    if os.geteuid() != 0:  # root writes anyway
        assert done.returncode == 1 and done.stderr.count("\n") == 1 and "workspace-setup: cannot create" in done.stderr and "Permission denied" in done.stderr


def test_a_team_may_send_the_initializers_content_key():
    """The annotation is no platform or controller key, which the team TrainJob policy refuses in a
    team's patches (k8s/builders/admission.py RESERVED_KEY_RE): a team's own job on the runtime with
    initializers sends it as the stack's FSDP job does."""
    from k8s.builders import admission

    assert not re.match(admission.RESERVED_KEY_RE, rt.INITIALIZED_KEY_ANNOTATION)
    assert re.match(admission.RESERVED_KEY_RE, "training-platform/initialized-key")  # the check can refuse
