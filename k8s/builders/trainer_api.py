"""Where Kubeflow Trainer versions differ, in one place.

v2.1.0 and v2.3.0 both serve ``trainer.kubeflow.org/v1alpha1`` but disagree on:

* the runtime's ``mlPolicy.torch``: v2.1 takes ``numProcPerNode`` there; v2.3 dropped it
  (the TrainJob's ``trainer.numProcPerNode`` decides);
* how a TrainJob customises the runtime's pods: ``podTemplateOverrides`` (v2.1) versus
  ``runtimePatches`` (v2.2+), whose ``manager`` must be a domain-prefixed path;
* the JobSet bundled (v0.10.1 / v0.12.0), which both support the failure-policy rules used here.
"""

from __future__ import annotations

from typing import Any

from config.infra_models import STATUS_SERVER_VERSIONS, TrainerSettings

API_VERSION = "trainer.kubeflow.org/v1alpha1"
PATCH_MANAGER = "training-platform.io/trainjobs"
TRAINER_JOB = "node"

# Initializers (the same in v2.1.0 and v2.3.0). The JobSet plugin fills the replicated job whose
# ``trainer.kubeflow.org/trainjob-ancestor-step`` label is ``dataset-initializer`` /
# ``model-initializer``, in its container of that same name, from TrainJob.spec.initializer: env
# STORAGE_URI = ``storageUri``, the ``env`` entries, and ``envFrom: [{secretRef}]`` for
# ``secretRef`` (pkg/runtime/framework/plugins/jobset/builder.go ``Initializer``). A TrainJob
# without spec.initializer leaves those jobs as the runtime has them: they still run (nothing drops
# them), and the upstream initializer then fails on the missing STORAGE_URI
# (pkg/initializers/dataset/__main__.py). The webhook wants such a job and container when the
# TrainJob names an initializer, and (v2.3.0) a volumeMount named ``initializer`` in that container
# (plugins/jobset/jobset.go ``Validate``, constants.go ``VolumeNameInitializer``).
# TrainJob progress (Trainer v2.3.0; alpha feature gate ``TrainJobStatus``, off by default:
# pkg/features/features.go). With it on, the controller serves
# ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` over TLS on
# ``statusServer.port`` (default 10443; charts/kubeflow-trainer values ``manager.config.statusServer``)
# of its Service, named like the manager (kubeflow-trainer-controller-manager), and its TrainJobStatus
# plugin gives every trainer container the URL, the CA and a projected token for that TrainJob
# (pkg/runtime/framework/plugins/trainjobstatus; workloads/programs/trainer_status.py sends).
# The chart takes feature gates as ``manager.config.featureGates``.
STATUS_FEATURE_GATE = "TrainJobStatus"
STATUS_SERVER_PORT = 10443
# the manager pods' labels (chart templates/_helpers.tpl trainer.selectorLabels and
# manager/_helpers.tpl trainer.manager.selectorLabels, release and chart named kubeflow-trainer)
MANAGER_POD_LABELS = {"app.kubernetes.io/name": "kubeflow-trainer", "app.kubernetes.io/component": "manager"}


def status_server_on(trainer: TrainerSettings) -> bool:
    """Whether the stack turns the Trainer's status server on (``trainer.progressInStatus``, on a
    release that has it). Off by default: the server verifies job tokens by OIDC discovery at the
    service-account issuer through a client that trusts only the cluster CA (pkg/statusserver/
    auth.go ``Init``: ``rest.HTTPClientFor`` of the in-cluster config, whose CA replaces the system
    roots), so an issuer outside the API server, as EKS's ``oidc.eks.<region>.amazonaws.com`` with
    its public certificate, fails that discovery, and the manager then exits at start."""
    return trainer.progress_in_status and trainer.version in STATUS_SERVER_VERSIONS


DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
INITIALIZER_VOLUME = "initializer"
STORAGE_URI_ENV = "STORAGE_URI"
# The upstream initializers read their settings from env named like their config fields, upper
# case (pkg/initializers/utils/utils.py get_config_from_env; types.py ``access_token``): a token
# Secret must hold the key ACCESS_TOKEN.
ACCESS_TOKEN_KEY = "ACCESS_TOKEN"
# Where they write: WORKSPACE_PATH ``/workspace`` + ``dataset`` / ``model`` (utils.py).
INITIALIZER_WORKSPACE = "/workspace"
INITIALIZED_DATASET = "dataset"
INITIALIZED_MODEL = "model"


def initializer_spec(*, dataset_uri: str | None, model_uri: str | None, token_secret: str | None, env: list[dict] | None = None) -> dict[str, Any]:
    """TrainJob.spec.initializer; the token only as a Secret reference (never a value); ``env``
    for both initializer containers."""
    spec: dict[str, Any] = {}
    for key, uri in (("dataset", dataset_uri), ("model", model_uri)):
        if uri is None:
            continue
        entry: dict[str, Any] = {"storageUri": uri}
        if env:
            entry["env"] = [dict(e) for e in env]
        if token_secret:
            entry["secretRef"] = {"name": token_secret}
        spec[key] = entry
    return spec


def torch_ml_policy(version: str) -> dict[str, Any]:
    if version == "v2.1.0":
        return {"numProcPerNode": "auto"}
    return {}


def pod_customization(version: str, *, metadata: dict | None, pod_spec: dict, job_metadata: dict[str, dict] | None = None) -> tuple[str, list[dict]]:
    """(field name, value) that applies ``pod_spec``/``metadata`` to the runtime's trainer pods, and
    ``job_metadata`` (replicated job name -> pod metadata) to the pods of other jobs of the runtime
    (both releases merge a patch's or override's pod metadata into the pod template: v2.1.0
    ``mergePodTemplateOverrides``, v2.3.0 ``mergeRuntimePatches``, pkg/runtime/core/trainingruntime.go)."""
    others = sorted((job_metadata or {}).items())
    if version == "v2.1.0":
        entry: dict[str, Any] = {"targetJobs": [{"name": TRAINER_JOB}], "spec": pod_spec}
        if metadata:
            entry["metadata"] = metadata
        return "podTemplateOverrides", [entry, *({"targetJobs": [{"name": name}], "metadata": md} for name, md in others)]
    pod_template: dict[str, Any] = {"spec": pod_spec}
    if metadata:
        pod_template["metadata"] = metadata
    jobs = [{"name": TRAINER_JOB, "template": {"spec": {"template": pod_template}}}]
    jobs += [{"name": name, "template": {"spec": {"template": {"metadata": md}}}} for name, md in others]
    patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}}}
    return "runtimePatches", [patch]


# What survives Kueue. Kueue v0.19.2 admits a TrainJob by a typed read-modify-write: its go.mod
# requires github.com/kubeflow/trainer/v2 v2.2.1, and RunWithPodSetsInfo (and Stop) send the whole
# TrainJob back with ``c.Update`` after decoding it into v2.2.1's Go types
# (pkg/controller/jobs/trainjob/trainjob_controller.go), so every field those types lack is dropped
# from the admitted job. The TrainJob fields of v2.3.0 (the CRD this platform installs) that v2.2.1
# lacks, from ``git diff v2.2.1 v2.3.0 -- pkg/apis/trainer/v1alpha1/trainjob_types.go``
# (kubeflow/trainer): one, ``PodSpecPatch.terminationGracePeriodSeconds``; the other changes in that
# diff are validation rules only. The field set of v2.3.0 itself is the maintained model package
# kubeflow-trainer-api 2.3.0 (tests/test_grace_period.py checks every field we emit against it).
KUEUE_TRAINER_TYPES = "v2.2.1"
_POD_PATCH = "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template.spec"
KUEUE_DROPPED_FIELDS = (f"{_POD_PATCH}.terminationGracePeriodSeconds",)


def field_paths(obj: Any, prefix: str = "") -> set[str]:
    """Every field path set in ``obj`` (lists as ``[]``; map keys of ``labels``, ``annotations``,
    ``nodeSelector``, resource lists and the like are values, not fields: see ``FREE_MAPS``)."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else key
            found.add(path)
            if key not in FREE_MAPS:
                found |= field_paths(value, path)
    elif isinstance(obj, list):
        for item in obj:
            found |= field_paths(item, f"{prefix}[]")
    return found


# maps whose keys are data (Kubernetes map[string]string / ResourceList fields)
FREE_MAPS = frozenset({"labels", "annotations", "nodeSelector", "limits", "requests", "matchLabels", "data", "binaryData"})


def dropped_by_kueue(trainjob: dict) -> list[str]:
    """The fields of ``trainjob`` that Kueue's admission drops (:data:`KUEUE_DROPPED_FIELDS`)."""
    return sorted(field_paths(trainjob) & set(KUEUE_DROPPED_FIELDS))


def read_pod_customization(trainjob_spec: dict) -> dict:
    """The trainer pods' spec customisation of a rendered TrainJob, whichever shape it has."""
    if "podTemplateOverrides" in trainjob_spec:
        for entry in trainjob_spec["podTemplateOverrides"]:
            if any(t["name"] == TRAINER_JOB for t in entry.get("targetJobs", [])):
                return entry.get("spec", {})
        return {}
    for patch in trainjob_spec.get("runtimePatches", []):
        for job in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
            if job["name"] == TRAINER_JOB:
                return job.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
    return {}
