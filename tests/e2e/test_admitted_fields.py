"""What our TrainJobs ask for is what their pods get, after Kueue admits them, and every runtime a
team can name runs in a team namespace under Pod Security ``restricted``: on the real API server
(Pod Security admission included), Kueue 0.19.2, Trainer v2.3.0 and JobSet, in a cluster of its
own of the teams stack with grace periods set (``trainer.graceClasses``, a job's own
``trainjobs.ddp.terminationGraceSeconds``).

Kueue admits a TrainJob by a typed update built on Trainer v2.2.1's Go types, which drops a pod
patch's ``terminationGracePeriodSeconds`` (k8s/builders/trainer_api.py ``KUEUE_DROPPED_FIELDS``); the
first test shows that drop on the real controllers, the others that nothing we send is dropped:
grace periods live in the runtimes (k8s/builders/runtimes.py)."""

from __future__ import annotations

import copy

import pytest

from k8s.builders import runtimes as rt
from k8s.builders import tenants, trainer_api
from tests.e2e.conftest import stack_file, wait_for
from tests.e2e.test_teams import STACK, TRAINJOB, as_team, submit
from tools.cluster.client import ApiError
from trainctl import code, objects
from workloads.builders import trainjobs as tj

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


@pytest.fixture(scope="module")
def dev(clusters):
    """The dev stack (no Kueue, no teams) with the same grace periods: the Trainer and JobSet alone."""
    stack = stack_file("dev")
    cfg = stack["config"]
    cfg["training-platform:trainer"] = {**cfg.get("training-platform:trainer", {}), "graceClasses": [OFFERED]}
    cfg["training-platform:trainjobs"]["ddp"] = {**cfg["training-platform:trainjobs"].get("ddp", {}), "enabled": True, "terminationGraceSeconds": DDP_GRACE}
    up = clusters.get("dev", instance="admitted-fields", stack_config=stack)
    yield up
    clusters.release("dev", "admitted-fields")


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


def _node_pods(up, namespace: str, job: str, count: int, *, kueue: bool = True) -> list[dict]:
    admin = up.client()
    if kueue:
        wait_for(f"{job} admitted by Kueue", lambda: _admitted(admin, namespace, job), up, timeout=180)
    return wait_for(f"{job}'s node pods running", lambda: _ran(_pods(admin, namespace, job, "node"), count), up, timeout=240)


def _holds(actual, wanted) -> bool:
    """``actual`` has everything ``wanted`` has (the API server adds defaults such as defaultMode)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_holds(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(actual, list) and len(actual) == len(wanted) and all(_holds(x, y) for x, y in zip(actual, wanted, strict=True))
    return actual == wanted


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
        assert _holds(volumes.get(v["name"]), v), v
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    for m in patch["containers"][0]["volumeMounts"]:
        assert _holds(mounts.get(m["mountPath"]), m), m
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
    platform used to send) is gone from the TrainJob once Kueue has admitted it. In the stack's own
    namespace (Kueue queues it too): a team's namespace refuses such a patch outright now
    (k8s/builders/admission.py)."""
    up, _ = teams
    admin = up.client()
    runtime = next(o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["labels"][rt.RUNTIME_LABEL] == "torch-distributed-gpu")
    (tmp_path / "train.py").write_text("print('hello')\n")
    configmap, job = objects.build(objects.Request(namespace="training", nodes=1, command=["python", "train.py"], name="old-way", runtime_name=runtime), code.collect(tmp_path))
    job = copy.deepcopy(job)
    trainer_api.read_pod_customization(job["spec"])["terminationGracePeriodSeconds"] = 600
    submit(admin, configmap, job)
    wait_for("old-way admitted by Kueue", lambda: _admitted(admin, "training", "old-way"), up, timeout=180)
    # admitted: Kueue writes its flavor into the TrainJob and unsuspends it (RunWithPodSetsInfo)
    stored = wait_for("old-way unsuspended by Kueue", lambda: (tj_ := admin.get(*TRAINJOB, "old-way", "training"))["spec"].get("suspend") is False and tj_, up, timeout=120)
    assert "terminationGracePeriodSeconds" not in trainer_api.read_pod_customization(stored["spec"])
    assert trainer_api.dropped_by_kueue(job) == list(trainer_api.KUEUE_DROPPED_FIELDS)  # what the builders refuse to send
    admin.delete(*TRAINJOB, "old-way", "training")


def test_the_stacks_job_keeps_its_grace_period_and_every_field_after_admission(teams):
    _stack_job_fields(teams[0], kueue=True)


def test_the_stacks_job_gets_its_grace_period_and_every_field_without_kueue_too(dev):
    _stack_job_fields(dev, kueue=False)


def _stack_job_fields(up, *, kueue: bool) -> None:
    admin = up.client()
    ns = next(o["metadata"]["namespace"] for o in up.plan.objects if o["kind"] == "TrainJob")
    name = tj.WORKLOADS["ddp"].name
    rendered = next(o for o in up.plan.objects if o["kind"] == "TrainJob" and o["metadata"]["name"] == name)
    assert bool(rendered["metadata"]["labels"].get("kueue.x-k8s.io/queue-name")) == kueue
    pods = _node_pods(up, ns, name, rendered["spec"]["trainer"]["numNodes"], kueue=kueue)
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


def _team_job(tmp_path, runtime: dict, name: str, *, namespace: str = "vision", version: str = "v2.3.0") -> tuple[dict, dict]:
    """A team's job on ``runtime`` as the team would send it: trainctl's on the torch and tensorflow
    families, the same shape on the others; on a runtime with initializers, a dataset and a model
    (and the content key for their pods, as the stack's FSDP job sends them)."""
    family = runtime["metadata"]["labels"].get(rt.FAMILY_LABEL, runtime["metadata"]["labels"][rt.RUNTIME_LABEL])
    kind = "tensorflow" if family == "tensorflow-distributed" else "torch"
    (tmp_path / "train.py").write_text("print('hello')\n")
    req = objects.Request(namespace=namespace, nodes=1, command=["python", "train.py"], runtime=kind, name=name, runtime_name=runtime["metadata"]["name"], trainer_version=version)
    configmap, job = objects.build(req, code.collect(tmp_path))
    has_initializers = any(j["name"] == trainer_api.DATASET_INITIALIZER for j in runtime["spec"]["template"]["spec"]["replicatedJobs"])
    if has_initializers:
        key = [{"name": rt.INITIALIZED_KEY_ENV, "value": "0123456789"}]
        job["spec"]["initializer"] = trainer_api.initializer_spec(dataset_uri="hf://FiscalNote/billsum", model_uri="hf://google-t5/t5-small", token_secret=None, env=key)
        pod = trainer_api.read_pod_customization(job["spec"])
        field, value = trainer_api.pod_customization(version, metadata=None, pod_spec=pod, job_metadata=tj.initializer_pod_metadata(job["spec"]["initializer"]))
        job["spec"][field] = value
    return configmap, job


def _every_step_runs(up, namespace: str, name: str, runtime: dict) -> None:
    """Each replicated job of the runtime has a pod that runs (or ran), as the non-root user; a pod
    Pod Security refused never appears, and the Job controller's FailedCreate says why."""
    admin = up.client()
    for step in [j["name"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]]:
        try:
            pods = wait_for(f"{name} ({runtime['metadata']['name']}) {step} pod running", lambda s=step: _ran(_pods(admin, namespace, name, s), 1), up, timeout=300)
        except AssertionError:
            refused = [e["message"] for e in admin.list("v1", "Event", namespace) if e.get("reason") == "FailedCreate" and name in e["involvedObject"]["name"]]
            raise AssertionError(f"{name} on {runtime['metadata']['name']}: no running {step} pod; FailedCreate: {refused[:2]}") from None
        assert all(p["spec"]["securityContext"].get("runAsNonRoot") for p in pods), step


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
        _every_step_runs(up, "vision", name, runtime)
        admin.delete(*TRAINJOB, name, "vision")


def _in_a_team_like_namespace(up, tmp_path, ns: str, version: str) -> None:
    """In a namespace set up as a team's (Pod Security ``restricted``, the team label, the team's
    checkpoint claim: a static volume bound to it, as k8s/builders/tenants.py makes one), a job on
    every runtime the stack renders, one after the other."""
    from k8s.builders.tenants import TEAM_LABEL, TEAM_POD_SECURITY_LABELS

    admin = up.client()
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {TEAM_LABEL: ns, **TEAM_POD_SECURITY_LABELS}}})
    pv, pvc = tenants.checkpoint_volume(ns=ns, storage_type="efs", volume_handle="fs-0123456789abcdef0::fsap-0123456789abcdef0", capacity_gib=10)
    admin.apply(pv)
    admin.apply(pvc)
    # the API server enforces it: the initializer pod as it was (issue 32: no runAsNonRoot) is refused, as it is now admitted
    template = rt.initializer_job(kind="dataset", image="ghcr.io/kubeflow/trainer/dataset-initializer:" + version)["template"]["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "initializer-check", "namespace": ns}, "spec": copy.deepcopy(template["spec"])}
    admin.create(pod, dry_run=True)
    pod["spec"]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    with pytest.raises(ApiError) as refused:
        admin.create(pod, dry_run=True)
    assert refused.value.status == 403 and "runAsNonRoot" in str(refused.value), refused.value
    runtimes = sorted((o for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime"), key=lambda r: r["metadata"]["name"])
    assert up.plan.trainer_version == version and {r["metadata"]["name"] for r in runtimes} == {r["metadata"]["name"] for r in admin.list(*RUNTIMES)}
    for i, runtime in enumerate(runtimes):
        name = f"runtime-{i}"
        (tmp_path / name).mkdir()
        configmap, job = _team_job(tmp_path / name, runtime, name, namespace=ns, version=version)
        submit(admin, configmap, job)
        _every_step_runs(up, ns, name, runtime)
        admin.delete(*TRAINJOB, name, ns)


def test_on_trainer_v2_3_without_kueue_every_runtime_runs_in_a_restricted_namespace(dev, tmp_path):
    """The dev stack's runtimes (grace variants included) on the Trainer and JobSet alone."""
    assert len([o for o in dev.plan.objects if o["kind"] == "ClusterTrainingRuntime"]) >= 8
    _in_a_team_like_namespace(dev, tmp_path, "team-v23-runtimes", "v2.3.0")


def test_on_trainer_v2_1_every_runtime_runs_in_a_restricted_namespace(clusters, tmp_path):
    """The workshop stack (Trainer v2.1.0: no teams, no Kueue)."""
    _in_a_team_like_namespace(clusters.get("workshop"), tmp_path, "team-v21-runtimes", "v2.1.0")
