"""The platform's alarms as Prometheus alert rules (``observability.mode: prometheus``): the same
four as the CloudWatch alarms (infra/alarms.py), on what that mode collects: kube-state-metrics
(Job failures, node conditions) and dcgm-exporter (GPU utilization, DCGM_FI_DEV_GPU_UTIL).
A PrometheusRule of monitoring.coreos.com/v1 (kube-prometheus-stack's operator; its Prometheus
selects every rule: ruleSelectorNilUsesHelmValues false, k8s/builders/operations.py)."""

from __future__ import annotations

from config.namespaces import MONITORING_NAMESPACE
from config.settings import Settings


def alert_rules(settings: Settings) -> dict:
    a = settings.observability.alarms
    namespaces = "|".join(settings.training_namespaces())
    rules = [
        {
            "alert": "TrainJobFailed",
            # a node Job of a TrainJob's JobSet that failed (its pods exhausted the failure policy)
            "expr": f'sum by (namespace, job_name) (kube_job_status_failed{{namespace=~"{namespaces}"}}) > 0',
            "labels": {"severity": "warning"},
            "annotations": {"summary": "TrainJob node Job {{ $labels.job_name }} in {{ $labels.namespace }} failed", "description": "trainctl diagnose tells why"},
        },
        {
            "alert": "TrainJobStalled",
            # GPUs allocated to pods but none used for the stall window: the job hangs
            "expr": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) == 0 and on (Hostname) (count by (Hostname) (DCGM_FI_DEV_GPU_UTIL) > 0)",
            "for": "30m",
            "labels": {"severity": "warning"},
            "annotations": {"summary": "GPUs on {{ $labels.Hostname }} at 0% for 30 min: a hung job", "description": "trainctl diagnose of the job on that node"},
        },
        {
            "alert": "GpusHeldIdle",
            "expr": f"avg(DCGM_FI_DEV_GPU_UTIL) < {a.idle_gpu_percent}",
            "for": f"{a.idle_minutes}m",
            "labels": {"severity": "info"},
            "annotations": {"summary": f"the cluster's GPUs below {a.idle_gpu_percent}% for {a.idle_minutes} min", "description": "GPUs held by jobs (or nodes) that do not use them"},
        },
        {
            "alert": "NodeNotReady",
            "expr": 'kube_node_status_condition{condition="Ready",status="true"} == 0',
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {"summary": "node {{ $labels.node }} not ready for 10 min", "description": "node repair replaces GPU nodes; look if it does not"},
        },
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "training-platform", "namespace": MONITORING_NAMESPACE},
        "spec": {"groups": [{"name": "training-platform", "rules": rules}]},
    }
