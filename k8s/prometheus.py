"""Metrics in ``observability.mode: prometheus``: kube-prometheus-stack, dcgm-exporter and the
Grafana dashboard (builders: ``k8s/builders/operations.py``)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kube

import versions
from config.settings import Settings
from k8s.builders.alerts import alert_rules
from k8s.builders.operations import MONITORING_NAMESPACE, dcgm_exporter_values, grafana_dashboard, grafana_dashboard_configmap, kube_prometheus_stack_values
from k8s.helm import release
from k8s.resources import apply_manifest


class PrometheusMonitoring(pulumi.ComponentResource):
    """``observability.mode: prometheus``: kube-prometheus-stack, then dcgm-exporter (its
    ServiceMonitor needs the stack's CRDs) and the Grafana dashboard."""

    def __init__(self, name: str, *, settings: Settings, provider: kube.Provider, depends_on: list[pulumi.Resource], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:k8s:PrometheusMonitoring", name, None, opts)

        def o(*deps) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[*depends_on, *deps])

        self.stack = release(
            "monitoring",
            chart=versions.KUBE_PROMETHEUS_STACK_CHART,
            repo=versions.KUBE_PROMETHEUS_STACK_REPO,
            version=versions.KUBE_PROMETHEUS_STACK_VERSION,
            namespace=MONITORING_NAMESPACE,
            create_namespace=True,
            values=kube_prometheus_stack_values(retention_days=15),
            opts=o(),
        )
        self.dcgm = release(
            "dcgm-exporter", chart=versions.DCGM_EXPORTER_CHART, repo=versions.DCGM_EXPORTER_REPO, version=versions.DCGM_EXPORTER_VERSION,
            namespace=MONITORING_NAMESPACE, values=dcgm_exporter_values(), opts=o(self.stack),
        )
        if settings.observability.alarms.enabled:
            self.rules = apply_manifest(alert_rules(settings), o(self.stack))
        self.dashboard = apply_manifest(grafana_dashboard_configmap(grafana_dashboard(training_namespaces=settings.training_namespaces())), o(self.stack))
        self.register_outputs({"namespace": MONITORING_NAMESPACE})
