"""What our TrainJobs ask for is what their pods get, after Kueue admits them, and every runtime a
team can name runs in a team namespace under Pod Security ``restricted``: on the real API server
(Pod Security admission included), Kueue 0.19.2, Trainer v2.3.0 and JobSet, in a cluster of its
own of the teams stack with grace periods set (``trainer.graceClasses``, a job's own
``trainjobs.ddp.terminationGraceSeconds``).

Kueue admits a TrainJob by a typed update built on Trainer v2.2.1's Go types, which drops a pod
patch's ``terminationGracePeriodSeconds`` (manifests/trainer_api.py ``KUEUE_DROPPED_FIELDS``); the
first test shows that drop on the real controllers, the others that nothing we send is dropped:
grace periods live in the runtimes (manifests/runtimes.py)."""

from __future__ import annotations

import copy

import pytest

from manifests import runtimes as rt
from manifests import trainer_api
from manifests import trainjobs as tj
from tests.e2e.conftest import stack_file, wait_for
from tests.e2e.test_teams import STACK, TRAINJOB, as_team, submit
from tools.cluster.client import ApiError
from trainctl import code, objects

RUNTIMES = ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime")
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
DDP_GRACE = 900
OFFERED = 600


@pytest.fixture(scope="module")
def teams(clusters):
    stack = stack_file(STACK)
    cfg = stack["config"]
    cfg["training-platform:trainer"] = {**cfg["training-platform:trainer"], "graceClasses": [OFFERED]}
    cfg["training-platform:trainjobs"]["ddp"]["terminationGraceSeconds"] = DDP_GRACE
    up = clusters.get(STACK, instance="admitted-fields", stack_config=stack)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    yield up, access
    clusters.release(STACK, "admitted-fields")


def _admitted(admin, namespace: str, job: str) -> dict | None:
    for w in admin.list(*WORKLOAD, namespace):
        if any(r["name"] == job for r in w["metadata"].get("ownerReferences", [])):
            conds = {c["type"]: c["status"] for c in (w.get("status") or {}).get("conditions") or []}
            return w if conds.get("Admitted") == "True" else None
    return None


def _pods(admin, namespace: str, job: str, replicated_job: str | None = None) -> list[dict]:
    selector = f"{JOBSET_LABEL}={job}" + (f",jobset.sigs.k8s.io/replicatedjob-name={replicated_job}" if replicated_job else "")
    return admin.list("v1", "Pod", namespace, label_selector=selector)


def _ran(pods: list[dict], count: int) -> list[dict] | None:
    """The pods once ``count`` of them run or ran (kwok's simulated containers)."""
    done = [p for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")]
    return done if len(done) >= count else None


def _node_pods(up, namespace: str, job: str, count: int) -> list[dict]:
    admin = up.client()
    wait_for(f"{job} admitted by Kueue", lambda: _admitted(admin, namespace, job), up, timeout=180)
    return wait_for(f"{job}'s node pods running", lambda: _ran(_pods(admin, namespace, job, "node"), count), up, timeout=240)


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _assert_fields(trainjob: dict, pod: dict, grace: int) -> None:
    """Every field the TrainJob and its runtime set, on the pod the controllers made."""
    spec = pod["spec"]
    (node,) = [c for c in spec["containers"] if c["name"] == "node"]
    patch = trainer_api.read_pod_customization(trainjob["spec"])
    # grace period (the runtime's variant), told to the program too
    assert spec["terminationGracePeriodSeconds"] == grace
    assert _env(node)[rt.GRACE_ENV] == str(grace)
    # env from the TrainJob's trainer block
    env = _env(node)
    for e in trainjob["spec"]["trainer"]["env"]:
        assert env.get(e["name"]) == e.get("value"), e
    # volumes and mounts from the pod patch
    volumes = {v["name"]: v for v in spec["volumes"]}
    for v in patch["volumes"]:
        assert {k: val for k, val in volumes[v["name"]].items() if k in v} == v, v
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    for m in patch["containers"][0]["volumeMounts"]:
        assert {k: mounts[m["mountPath"]].get(k) for k in m} == m, m
    # node selector from the patch (Kueue adds its flavor's labels beside it)
    for k, val in patch["nodeSelector"].items():
        assert spec["nodeSelector"].get(k) == val, k
    # the runtime's GPU toleration and the resources per node
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    wanted = trainjob["spec"]["trainer"]["resourcesPerNode"]
    assert str(node["resources"]["limits"]["nvidia.com/gpu"]) == str(wanted["limits"]["nvidia.com/gpu"])
    assert node["resources"]["requests"]["memory"] == wanted["requests"]["memory"]
    assert pod["metadata"]["annotations"].get("karpenter.sh/do-not-disrupt") == "true"


def test_kueues_admission_drops_a_pod_patch_grace_period(teams, tmp_path):
    """The upstream fact, on the real controllers: the grace period in a pod patch (what the
    platform used to send) is gone from the TrainJob once Kueue has admitted it."""
    up, _ = teams
    admin = up.client()
    runtime = next(o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["labels"][rt.RUNTIME_LABEL] == "torch-distributed-gpu")
    (tmp_path / "train.py").write_text("print('hello')\n")
    configmap, job = objects.build(objects.Request(namespace="vision", nodes=1, command=["python", "train.py"], name="old-way", runtime_name=runtime), code.collect(tmp_path))
    job = copy.deepcopy(job)
    trainer_api.read_pod_customization(job["spec"])["terminationGracePeriodSeconds"] = 600
    submit(admin, configmap, job)
    wait_for("old-way admitted by Kueue", lambda: _admitted(admin, "vision", "old-way"), up, timeout=180)
    stored = admin.get(*TRAINJOB, "old-way", "vision")
    assert "terminationGracePeriodSeconds" not in trainer_api.read_pod_customization(stored["spec"])
    assert trainer_api.dropped_by_kueue(job) == list(trainer_api.KUEUE_DROPPED_FIELDS)  # what the builders refuse to send
    admin.delete(*TRAINJOB, "old-way", "vision")


def test_the_stacks_job_keeps_its_grace_period_and_every_field_after_admission(teams):
    up, _ = teams
    admin = up.client()
    ns = next(o["metadata"]["namespace"] for o in up.plan.objects if o["kind"] == "TrainJob")
    name = tj.WORKLOADS["ddp"].name
    rendered = next(o for o in up.plan.objects if o["kind"] == "TrainJob" and o["metadata"]["name"] == name)
    pods = _node_pods(up, ns, name, rendered["spec"]["trainer"]["numNodes"])
    stored = admin.get(*TRAINJOB, name, ns)
    assert stored["spec"]["runtimeRef"]["name"].startswith(f"torch-distributed-gpu-grace{DDP_GRACE}-")
    assert trainer_api.read_pod_customization(stored["spec"]) == trainer_api.read_pod_customization(rendered["spec"])  # our patch, whole
    for pod in pods:
        _assert_fields(rendered, pod, DDP_GRACE)


def test_a_team_job_with_grace_seconds_gets_the_published_variant_and_keeps_every_field(teams, tmp_path):
    up, access = teams
    vision = as_team(up, access, "vision")
    published = vision.list(*RUNTIMES)  # what the team can read, as trainctl reads it
    (tmp_path / "train.py").write_text("print('hello')\n")
    req = objects.Request(namespace="vision", nodes=2, command=["python", "train.py"], name="long-save", grace_seconds=OFFERED, gpus_per_node=1, instance_type="g5.12xlarge")
    req = objects.Request(**{**req.__dict__, "runtime_name": objects.runtime_for(req, published)})
    with pytest.raises(objects.SubmitError, match=f"offer 120 \\(the default\\), {OFFERED}, {DDP_GRACE}"):
        objects.runtime_for(objects.Request(**{**req.__dict__, "grace_seconds": 450}), published)
    configmap, job = objects.build(req, code.collect(tmp_path))
    submit(vision, configmap, job)
    pods = _node_pods(up, "vision", "long-save", 2)
    stored = up.client().get(*TRAINJOB, "long-save", "vision")
    assert trainer_api.read_pod_customization(stored["spec"]) == trainer_api.read_pod_customization(job["spec"])
    for pod in pods:
        _assert_fields(job, pod, OFFERED)


def _team_job(tmp_path, runtime: dict, name: str) -> tuple[dict, dict]:
    """A team's job on ``runtime`` as the team would send it: trainctl's on the torch and tensorflow
    families, the same shape on the others; on a runtime with initializers, a dataset and a model."""
    family = runtime["metadata"]["labels"][rt.FAMILY_LABEL]
    kind = "tensorflow" if family == "tensorflow-distributed" else "torch"
    (tmp_path / "train.py").write_text("print('hello')\n")
    req = objects.Request(namespace="vision", nodes=1, command=["python", "train.py"], runtime=kind, name=name, runtime_name=runtime["metadata"]["name"])
    configmap, job = objects.build(req, code.collect(tmp_path))
    has_initializers = any(j["name"] == trainer_api.DATASET_INITIALIZER for j in runtime["spec"]["template"]["spec"]["replicatedJobs"])
    if has_initializers:
        key = [{"name": rt.INITIALIZED_KEY_ENV, "value": "0123456789"}]
        job["spec"]["initializer"] = trainer_api.initializer_spec(dataset_uri="hf://FiscalNote/billsum", model_uri="hf://google-t5/t5-small", token_secret=None, env=key)
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        patch += [{"name": n, "template": {"spec": {"template": {"metadata": md}}}} for n, md in sorted(tj.initializer_pod_metadata(job["spec"]["initializer"]).items())]
    return configmap, job


def test_a_team_job_on_every_runtime_the_team_can_name_runs_under_restricted(teams, tmp_path):
    """Each ClusterTrainingRuntime the team may read (every one the stack renders, grace variants
    included), one job each, as the team: its pods pass Pod Security ``restricted`` (the Job
    controller creates them; a refused pod never appears) and run, initializers first."""
    up, access = teams
    vision = as_team(up, access, "vision")
    admin = up.client()
    assert admin.get("v1", "Namespace", "vision")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    runtimes = sorted(vision.list(*RUNTIMES), key=lambda r: r["metadata"]["name"])
    rendered = {o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime"}
    assert {r["metadata"]["name"] for r in runtimes} == rendered and len(rendered) >= 8
    jobs = {}
    for i, runtime in enumerate(runtimes):
        name = f"on-runtime-{i}"
        (tmp_path / name).mkdir()
        configmap, job = _team_job(tmp_path / name, runtime, name)
        submit(vision, configmap, job)
        jobs[name] = runtime
    for name, runtime in jobs.items():
        steps = [j["name"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
        for step in steps:
            try:
                pods = wait_for(f"{name} ({runtime['metadata']['name']}) {step} pod running", lambda n=name, s=step: _ran(_pods(admin, "vision", n, s), 1), up, timeout=300)
            except AssertionError:
                refused = [e["message"] for e in admin.list("v1", "Event", "vision") if e.get("reason") == "FailedCreate" and name in e["involvedObject"]["name"]]
                raise AssertionError(f"{name} on {runtime['metadata']['name']}: no running {step} pod; FailedCreate: {refused[:2]}") from None
            assert all(p["spec"]["securityContext"].get("runAsNonRoot") for p in pods), step
        try:
            admin.delete(*TRAINJOB, name, "vision")
        except ApiError:
            pass
