"""Cluster side of operating the platform: the Prometheus stack (``observability.mode:
prometheus``), the deploy-time GPU smoke check, and the cleanup of finished TrainJobs.

Pure builders (plain dicts from typed settings); ``k8s/prometheus.py`` and
``k8s/operations.py`` register them. The AWS side of ``observability.mode: cloudwatch``
(the EKS add-on, its IAM, log groups, the dashboard) is ``infra/observability.py``.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import versions
from config.namespaces import MONITORING_NAMESPACE, OPS_NAMESPACE  # noqa: F401  (part of this module's interface)
from config.settings import Settings
from k8s.builders import gpu_objects as g
from k8s.builders.runtimes import DO_NOT_DISRUPT
from k8s.builders.tenants import TTL_ANNOTATION

SMOKE_CHECK = "gpu-smoke-check"
CLEANUP = "trainjob-cleanup"
FENCE = "preflight-fence"
COMPONENT_LABEL = "training-platform/component"
_PODS = pathlib.Path(__file__).resolve().parent.parent / "pods"  # programs that run in pods
SMOKE_CHECK_SCRIPT = _PODS / "gpu_smoke_check.py"
CLEANUP_SCRIPT = _PODS / "trainjob_cleanup.py"
FENCE_SCRIPT = _PODS / "preflight_fence.py"
SCRIPT_MOUNT = "/opt/platform-ops"
# A job's GPU node is launched by Karpenter and the CUDA image (several GB) pulled on it: minutes.
SMOKE_CHECK_TIMEOUT = "30m"


# --- scheduling ---------------------------------------------------------------------------------


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Whether a pod with ``tolerations`` may be scheduled onto a node with ``taint``, by the
    Kubernetes rules (core/v1 Toleration): an empty key with ``Exists`` matches every key, an
    empty effect every effect; ``Exists`` ignores the value, ``Equal`` (the default) compares it."""
    for t in tolerations:
        op = t.get("operator", "Equal")
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if not t.get("key") and op != "Exists":
            continue
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if op == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _gpu_node_affinity() -> dict:
    """Nodes of the GPU pools (the same terms the NVIDIA device plugin is scheduled with)."""
    return g.nvidia_device_plugin_values()["affinity"]


# --- prometheus mode ----------------------------------------------------------------------------

# The value paths the platform sets in each chart and where the chart reads them, from the charts'
# values.yaml at the pinned versions: NVIDIA/dcgm-exporter deployment/values.yaml (4.8.2);
# prometheus-community/helm-charts charts/kube-prometheus-stack/values.yaml (88.5.3) and the
# subcharts it pins, charts/kube-state-metrics (8.4.0) and charts/prometheus-node-exporter (4.56.1)
# values.yaml; grafana-community/helm-charts charts/grafana/values.yaml (12.11.1).
CHART_VALUE_PATHS: dict[str, frozenset[str]] = {
    versions.DCGM_EXPORTER_CHART: frozenset({"tolerations", "affinity", "nodeSelector", "priorityClassName", "serviceMonitor.enabled", "serviceMonitor.interval", "resources"}),
    versions.KUBE_PROMETHEUS_STACK_CHART: frozenset({
        "prometheus.prometheusSpec.affinity", "prometheus.prometheusSpec.retention", "prometheus.prometheusSpec.serviceMonitorSelectorNilUsesHelmValues",
        "prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues", "prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues",
        "alertmanager.alertmanagerSpec.affinity", "prometheusOperator.affinity", "prometheusOperator.admissionWebhooks.patch.affinity",
        "prometheusOperator.admissionWebhooks.deployment.affinity", "grafana.affinity", "grafana.sidecar.dashboards.enabled", "grafana.sidecar.dashboards.label",
        "grafana.sidecar.dashboards.labelValue", "kube-state-metrics.affinity", "kube-state-metrics.metricLabelsAllowlist",
        "prometheus-node-exporter.tolerations", "prometheus-node-exporter.affinity",
    }),
}
# Workloads of each chart that run on every node (DaemonSets: they must tolerate the GPU taint)
# and those that must stay on the system node groups, by the value path that places them.
DAEMONSET_TOLERATIONS = {versions.DCGM_EXPORTER_CHART: ["tolerations"], versions.KUBE_PROMETHEUS_STACK_CHART: ["prometheus-node-exporter.tolerations"]}
SYSTEM_AFFINITIES = {
    versions.DCGM_EXPORTER_CHART: [],
    versions.KUBE_PROMETHEUS_STACK_CHART: [
        "prometheus.prometheusSpec.affinity", "alertmanager.alertmanagerSpec.affinity", "prometheusOperator.affinity",
        "prometheusOperator.admissionWebhooks.patch.affinity", "prometheusOperator.admissionWebhooks.deployment.affinity", "grafana.affinity", "kube-state-metrics.affinity",
    ],
}
GRAFANA_DASHBOARD_LABEL = ("grafana_dashboard", "1")  # the kube-prometheus-stack grafana sidecar's default label


def dcgm_exporter_values() -> dict:
    """On GPU-pool nodes only, tolerating the GPU taint; scraped through its ServiceMonitor."""
    return {
        "tolerations": [dict(g.GPU_TOLERATION)],
        "affinity": _gpu_node_affinity(),
        "priorityClassName": "system-node-critical",
        "serviceMonitor": {"enabled": True, "interval": "15s"},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
    }


def kube_prometheus_stack_values(*, retention_days: int) -> dict:
    """Prometheus, Alertmanager, the operator, Grafana and kube-state-metrics on the system node
    groups; node-exporter on every node (the GPU taint included). Prometheus selects every
    ServiceMonitor (dcgm-exporter's comes from another release); kube-state-metrics exports the
    nodes' pool label for the dashboard."""
    system = g.SYSTEM_NODE_AFFINITY
    return {
        "prometheus": {
            "prometheusSpec": {
                "affinity": system,
                "retention": f"{retention_days}d",
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
            }
        },
        "alertmanager": {"alertmanagerSpec": {"affinity": system}},
        "prometheusOperator": {"affinity": system, "admissionWebhooks": {"patch": {"affinity": system}, "deployment": {"affinity": system}}},
        "grafana": {"affinity": system, "sidecar": {"dashboards": {"enabled": True, "label": GRAFANA_DASHBOARD_LABEL[0], "labelValue": GRAFANA_DASHBOARD_LABEL[1]}}},
        "kube-state-metrics": {"affinity": system, "metricLabelsAllowlist": [f"nodes=[{g.POOL_LABEL}]"]},
        "prometheus-node-exporter": {"tolerations": [{"operator": "Exists"}], "affinity": {}},
    }


def value_paths(values: dict, prefix: str = "") -> set[str]:
    """Dotted paths of the leaves of a values tree (a dict value that is a Kubernetes object, such as
    an affinity, is one leaf: its path must be one the chart reads)."""
    out: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not (set(value) & {"nodeAffinity", "podAffinity", "podAntiAffinity", "requests", "limits"}):
            out |= value_paths(value, path + ".")
        else:
            out.add(path)
    return out


def get_path(values: dict, path: str) -> Any:
    cur: Any = values
    for key in path.split("."):
        cur = cur[key]
    return cur


def grafana_dashboard(*, training_namespaces: list[str]) -> dict:
    """The prometheus mode's dashboard (Grafana JSON model): GPU use per node (dcgm-exporter), pending
    GPU pods and container restarts in the training namespaces and nodes per pool (kube-state-metrics)."""
    ns = "|".join(sorted(training_namespaces))
    panels = [
        ("GPU utilisation per node (%)", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"),
        ("GPU memory used per node (%)", "100 * sum by (Hostname) (DCGM_FI_DEV_FB_USED) / sum by (Hostname) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)"),
        ("Pending GPU pods", 'sum(kube_pod_status_phase{phase="Pending"} * on (namespace, pod) group_left max by (namespace, pod) (kube_pod_container_resource_requests{resource="nvidia_com_gpu"}) > 0)'),
        ("Container restarts (training namespaces)", f'sum by (namespace) (increase(kube_pod_container_status_restarts_total{{namespace=~"{ns}"}}[1h]))'),
        ("Failed training pods (job restarts)", f'sum by (namespace) (kube_pod_status_phase{{phase="Failed",namespace=~"{ns}"}})'),
        ("Nodes per GPU pool", f"count by (label_{g.POOL_LABEL.replace('/', '_').replace('-', '_')}) (kube_node_labels{{label_{g.POOL_LABEL.replace('/', '_').replace('-', '_')}!=\"\"}})"),
    ]
    return {
        "title": "Training platform",
        "uid": "training-platform",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "panels": [
            {"id": i + 1, "type": "timeseries", "title": title, "gridPos": {"x": (i % 2) * 12, "y": (i // 2) * 8, "w": 12, "h": 8}, "targets": [{"expr": expr, "refId": "A"}]}
            for i, (title, expr) in enumerate(panels)
        ],
    }


def grafana_dashboard_configmap(dashboard: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "training-platform-dashboard", "namespace": MONITORING_NAMESPACE, "labels": {GRAFANA_DASHBOARD_LABEL[0]: GRAFANA_DASHBOARD_LABEL[1]}},
        "data": {"training-platform.json": json.dumps(dashboard, sort_keys=True)},
    }


# --- objects in the ops namespace -----------------------------------------------------------------


def ops_network_policy() -> dict:
    """Nothing in the operations namespace serves: deny every ingress to its pods (egress stays
    open: the API server, the image registry)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-ingress", "namespace": OPS_NAMESPACE},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }


def ops_namespace() -> dict:
    """The smoke check and the cleanup run as non-root with nothing extra: restricted enforced."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPS_NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}


def _restricted(uid: int) -> tuple[dict, dict]:
    """(pod securityContext, container securityContext) of Pod Security's restricted profile."""
    pod = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def script_configmap(name: str, script: pathlib.Path) -> dict:
    """The script as a ConfigMap named by its content, so a changed script rolls what runs it."""
    text = script.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-{digest}", "namespace": OPS_NAMESPACE, "labels": {COMPONENT_LABEL: name}}, "immutable": True, "data": {script.name: text}}


def smoke_check_instance_type(settings: Settings) -> str:
    """The configured type, else the gpu-pool's type with the fewest GPUs (then the least memory)."""
    if settings.smoke_checks.instance_type:
        return settings.smoke_checks.instance_type
    return min(settings.gpu_pool.allowed_types(), key=lambda i: (i.gpus, i.memory_gib, i.name)).name


def smoke_check_job(settings: Settings, *, configmap: str, image: str = versions.WORKLOAD_BASE_IMAGE) -> dict:
    """One pod on a gpu-pool node with one GPU: ``nvidia-smi``, then a CUDA matmul checked against
    the CPU (k8s/pods/gpu_smoke_check.py). The default image is the training image's CUDA/PyTorch base,
    so a failure points at the node, driver or device plugin, not at the stack's image build."""
    instance_type = smoke_check_instance_type(settings)
    pod_sc, container_sc = _restricted(int(versions.WORKLOAD_UID))
    labels = {COMPONENT_LABEL: SMOKE_CHECK}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": SMOKE_CHECK, "namespace": OPS_NAMESPACE, "labels": labels},
        "spec": {
            "backoffLimit": 1,  # one retry: a node lost mid-check, not a broken GPU path
            "activeDeadlineSeconds": 1800,
            "template": {
                "metadata": {"labels": labels, "annotations": dict(DO_NOT_DISRUPT)},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "nodeSelector": {g.POOL_LABEL: g.GPU_POOL, "node.kubernetes.io/instance-type": instance_type},
                    "tolerations": [dict(g.GPU_TOLERATION)],
                    "securityContext": pod_sc,
                    "containers": [
                        {
                            "name": "check",
                            "image": image,
                            "command": ["/bin/sh", "-c", f"nvidia-smi && exec python3 {SCRIPT_MOUNT}/{SMOKE_CHECK_SCRIPT.name}"],
                            "env": [{"name": "HOME", "value": "/tmp"}],
                            "resources": {
                                "requests": {"cpu": "1", "memory": "4Gi"},
                                "limits": {"nvidia.com/gpu": 1, "memory": "4Gi"},
                            },
                            "securityContext": container_sc,
                            "volumeMounts": [{"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [{"name": "script", "configMap": {"name": configmap}}, {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
        },
    }


def cleanup_rbac() -> list[dict]:
    """List and delete TrainJobs, cluster-wide (teams' namespaces included), and nothing else."""
    return _ops_rbac(CLEANUP, [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["list", "delete"]}])


def fence_rbac() -> list[dict]:
    """List pods (read-only, every namespace) and get and patch nodes; nothing else."""
    return _ops_rbac(FENCE, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}])


def _ops_rbac(name: str, rules: list[dict]) -> list[dict]:
    """A platform-ops ServiceAccount and the ClusterRole (``rules``) bound to it."""
    meta = {"name": name, "labels": {COMPONENT_LABEL: name}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": OPS_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": OPS_NAMESPACE}],
        },
    ]


def cleanup_cronjob(settings: Settings, *, configmap: str, keep_kinds: list[str], job_label: str) -> dict:
    """Every 10 minutes: delete finished TrainJobs older than their retention: the seconds a job's
    ``TTL_ANNOTATION`` asks for, at most ``trainjobs.finishedJobRetentionMax``, else
    ``trainjobs.finishedJobRetention`` (k8s/pods/trainjob_cleanup.py)."""
    env = {"RETENTION": settings.trainjobs.finished_job_retention, "RETENTION_MAX": settings.trainjobs.retention_max(), "TTL_ANNOTATION": TTL_ANNOTATION,
           "KEEP_JOB_KINDS": ",".join(sorted(keep_kinds)), "JOB_LABEL": job_label, "KEEP_NAMESPACE": settings.trainjobs.namespace}
    return _ops_cronjob(CLEANUP, "*/10 * * * *", CLEANUP_SCRIPT, env, configmap=configmap, container="cleanup", why="the cleanup calls the Kubernetes API with its ServiceAccount (list/delete TrainJobs only)", deadline_s=540)


def fence_cronjob(*, configmap: str) -> dict:
    """Every two minutes: taint the nodes a preflight failed on (k8s/pods/preflight_fence.py)."""
    return _ops_cronjob(FENCE, "*/2 * * * *", FENCE_SCRIPT, {}, configmap=configmap, container="fence", why="the fence calls the Kubernetes API with its ServiceAccount (list pods, get/patch nodes only)", deadline_s=110)


def _ops_cronjob(name: str, schedule: str, script: pathlib.Path, env: dict[str, str], *, configmap: str, container: str, why: str, deadline_s: int) -> dict:
    """A platform-ops CronJob running one of k8s/pods/'s programs from its ConfigMap, as its own
    ServiceAccount (``name``), restricted, on the system nodes."""
    pod_sc, container_sc = _restricted(65534)
    labels = {COMPONENT_LABEL: name}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": name,
            "namespace": OPS_NAMESPACE,
            "labels": labels,
            # checkov inline skip: this pod calls the API, so it needs its token
            "annotations": {"checkov.io/skip1": f"CKV_K8S_38={why}"},
        },
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 2,
                    "activeDeadlineSeconds": deadline_s,
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "restartPolicy": "Never",
                            "serviceAccountName": name,
                            "affinity": g.SYSTEM_NODE_AFFINITY,
                            "securityContext": pod_sc,
                            "containers": [
                                {
                                    "name": container,
                                    "image": versions.TRAINJOB_CLEANUP_IMAGE,
                                    "command": ["python3", f"{SCRIPT_MOUNT}/{script.name}"],
                                    "env": [{"name": k, "value": v} for k, v in env.items()],
                                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                                    "securityContext": container_sc,
                                    "volumeMounts": [{"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True}],
                                }
                            ],
                            "volumes": [{"name": "script", "configMap": {"name": configmap}}],
                        },
                    },
                }
            },
        },
    }
