"""Observability's AWS half (``observability.mode: cloudwatch``): the CloudWatch add-on, its Pod
Identity, the log groups and the dashboard. The whole (``k8s/observability.py`` ``Observability``)
adds the Kubernetes half: Prometheus, the smoke check and the job cleanup.


``observability.mode: cloudwatch`` (default) is AWS-native: the ``amazon-cloudwatch-observability``
EKS add-on (Container Insights with enhanced observability: NVIDIA GPU metrics through its DCGM
exporter, EFA and Neuron metrics, Fluent Bit shipping container logs), its IAM through EKS Pod
Identity, the Container Insights log groups with the configured retention, and a CloudWatch
dashboard. ``prometheus``: dcgm-exporter and kube-prometheus-stack with a Grafana dashboard
(``k8s/builders/operations.py``). ``none``: neither. The GPU smoke check and the cleanup of finished
TrainJobs come in every mode (``k8s/builders/operations.py`` ``Operations``).

Facts relied on, and where they come from:

* The add-on is the aws-observability/helm-charts chart ``amazon-cloudwatch-observability``; its
  configuration is the chart's values: ``tolerations`` (root, inherited by the DaemonSets:
  ``_helpers.tpl`` ``amazon-cloudwatch-observability.common.tolerations``, added in
  aws-observability/helm-charts#41 for aws/containers-roadmap#2195), ``containerLogs.enabled``
  (Fluent Bit) and ``agent.config`` (the CloudWatch agent JSON: ``logs.metrics_collected.kubernetes``
  with ``enhanced_container_insights`` and ``accelerated_compute_metrics``; the key names are
  those of aws/amazon-cloudwatch-agent-operator and the CloudWatch User Guide's opt-out example).
* The agent runs as ServiceAccount ``cloudwatch-agent`` in namespace ``amazon-cloudwatch``
  (aws/amazon-cloudwatch-agent-operator: ``amazonCloudWatchNamespace``, ``amazonCloudWatchAgentName``;
  the chart's ``cloudwatch-agent.serviceAccountName``). Pod Identity works from add-on 3.1.0 (CloudWatch
  User Guide, "Quick start with the Amazon CloudWatch Observability EKS add-on") and needs the
  ``eks-pod-identity-agent`` add-on, which ``infra/gpu_aws.py`` installs in both modes: EKS Auto
  Mode runs the Pod Identity agent only on its own nodes (EKS User Guide, "Automate cluster
  infrastructure with EKS Auto Mode": the agent is one of Auto Mode's built-in components), and the
  CloudWatch agent also runs on the managed node groups (``config/node_agents.yaml``).
* Permissions: the AWS-managed ``CloudWatchAgentServerPolicy`` (EKS User Guide, "Amazon CloudWatch
  Observability agent" add-on page). ``AWSXrayWriteOnlyAccess`` is for Application Signals' traces;
  the agent configuration here collects none (no ``application_signals``), so it is not attached.
* Log groups (Fluent Bit ``log_group_name`` in the chart's values.yaml, the agent's performance
  events): ``/aws/containerinsights/<cluster>/{application,dataplane,host,performance}``. Fluent Bit
  creates a missing group itself (``auto_create_group true``) with no retention; the stack creates
  them first (the add-on depends on them). On AL2023 nodes the dataplane and host groups stay
  empty unless journald is read (CloudWatch User Guide, same quick start page).
* Metric names and dimensions: CloudWatch User Guide, "Amazon EKS and Kubernetes Container Insights
  with enhanced observability metrics" (``node_gpu_utilization``, ``node_gpu_memory_utilization``,
  ``node_efa_rx_bytes``/``node_efa_tx_bytes`` by ClusterName/InstanceId/NodeName; ``pod_status_pending``
  and ``pod_status_failed`` by ClusterName/Namespace/PodName/...; ``cluster_node_count``).
* Karpenter logs ``"message": "launched nodeclaim"`` (JSON) for each node it launches
  (kubernetes-sigs/karpenter ``pkg/controllers/nodeclaim/lifecycle/launch.go``).
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

import versions
from config.names import IAM_ROLE, aws_name
from config.namespaces import AGENT_NAMESPACE  # noqa: F401  (part of this module's interface)
from config.settings import Settings
from infra.cluster import Cluster
from infra.gpu_aws import GpuAws, aws_partition, pod_identity_trust
from k8s.builders.gpu_objects import KARPENTER_NAMESPACE

ADDON_NAME = "amazon-cloudwatch-observability"
AGENT_SERVICE_ACCOUNT = "cloudwatch-agent"
AGENT_POLICY = "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"
LOG_GROUP_KINDS = ("application", "dataplane", "host", "performance")
METRICS_NAMESPACE = "ContainerInsights"
DASHBOARD_NAME_LIMIT = 255  # CloudWatch PutDashboard: DashboardName up to 255 of A-Z a-z 0-9 - _
DASHBOARD_GRID_WIDTH = 24  # CloudWatch dashboard body: the grid is 24 units wide


def log_group_name(cluster_name: str, kind: str) -> str:
    return f"/aws/containerinsights/{cluster_name}/{kind}"


def dashboard_name(cluster_name: str) -> str:
    return aws_name(cluster_name, "training", limit=DASHBOARD_NAME_LIMIT, allowed=r"[A-Za-z0-9_-]")


def agent_role_name(cluster_name: str) -> str:
    return IAM_ROLE.name(cluster_name, "cloudwatch-agent")


def addon_configuration() -> dict[str, Any]:
    """The add-on's configuration values: every DaemonSet tolerates every taint (the GPU taint
    ``nvidia.com/gpu:NoSchedule`` included; the chart's default, pinned here so an add-on update
    cannot narrow it), Fluent Bit ships container logs, the agent collects enhanced Container
    Insights with accelerated-compute (NVIDIA GPU, Neuron) metrics."""
    return {
        "tolerations": [{"operator": "Exists"}],
        "containerLogs": {"enabled": True},
        "agent": {"config": {"logs": {"metrics_collected": {"kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": True}}}}},
    }


# --- the dashboard ------------------------------------------------------------------------------


def _search(cluster: str, schema: str, metric: str, stat: str, extra: str = "") -> str:
    return f"SEARCH('{{{METRICS_NAMESPACE},{schema}}} MetricName=\"{metric}\" ClusterName=\"{cluster}\"{extra}', '{stat}', 60)"


def _metric_widget(title: str, region: str, expressions: list[tuple[str, str]], *, y_max: float | None = None) -> dict:
    props: dict[str, Any] = {
        "title": title, "region": region, "view": "timeSeries", "stacked": False, "period": 60,
        "metrics": [[{"expression": expr, "id": f"e{i + 1}", "label": label}] for i, (expr, label) in enumerate(expressions)],
    }
    if y_max is not None:
        props["yAxis"] = {"left": {"min": 0, "max": y_max}}
    return {"type": "metric", "properties": props}


def _log_widget(title: str, region: str, log_group: str, query: str, view: str = "timeSeries") -> dict:
    return {"type": "log", "properties": {"title": title, "region": region, "view": view, "query": f"SOURCE '{log_group}' | {query}"}}


def _training(query: str, kind: str) -> str:
    return f"filter log_processed.{_METRIC_KEY} = '{kind}' | {query}"


_METRIC_KEY = "training_metric"  # workloads/programs/trainlib.py METRIC_KEY


def dashboard_body(*, cluster_name: str, region: str, training_namespaces: list[str], karpenter: bool, teams: dict[str, str] | None = None) -> dict:
    """The CloudWatch dashboard (PutDashboard's DashboardBody: ``widgets`` with ``type``, ``x``, ``y``,
    ``width``, ``height``, ``properties``): GPU utilisation and memory per node, EFA bytes per node,
    pending and failed pods in the training namespaces, job attempts, nodes (and Karpenter's
    launches), and the training programs' own metrics from their JSON log lines."""
    app = log_group_name(cluster_name, "application")
    ns_filter = " (" + " OR ".join(f'Namespace="{ns}"' for ns in sorted(training_namespaces)) + ")"
    pods = "ClusterName,Namespace,PodName"
    node = "ClusterName,InstanceId,NodeName"
    widgets = [
        _metric_widget("GPU utilisation per node (%)", region, [(_search(cluster_name, node, "node_gpu_utilization", "Average"), "")], y_max=100),
        _metric_widget("GPU memory used per node (%)", region, [(_search(cluster_name, node, "node_gpu_memory_utilization", "Average"), "")], y_max=100),
        _metric_widget("EFA bytes per node (received, sent)", region, [
            (_search(cluster_name, node, "node_efa_rx_bytes", "Average"), "rx"), (_search(cluster_name, node, "node_efa_tx_bytes", "Average"), "tx"),
        ]),
        _metric_widget("Pending and failed pods in the training namespaces", region, [
            (f"SUM({_search(cluster_name, pods, 'pod_status_pending', 'Maximum', ns_filter)})", "pending"),
            (f"SUM({_search(cluster_name, pods, 'pod_status_failed', 'Maximum', ns_filter)})", "failed"),
        ]),
        _log_widget("Job attempts (a restart starts the program again)", region, app,
                    _training("filter log_processed.node_rank = 0 | stats count(*) as attempts by log_processed.job", "start"), view="table"),
        _metric_widget("Nodes in the cluster", region, [(_search(cluster_name, "ClusterName", "cluster_node_count", "Maximum"), "nodes")]),
        _log_widget("Training loss by job", region, app, _training("filter log_processed.node_rank = 0 | stats avg(log_processed.loss) as loss by bin(1m), log_processed.job", "step")),
        _log_widget("Throughput by job (tokens/s or samples/s)", region, app, _training(
            "filter log_processed.node_rank = 0 | stats avg(log_processed.tokens_per_s) as tokens_per_s, avg(log_processed.samples_per_s) as samples_per_s by bin(1m), log_processed.job", "step")),
        _log_widget("Step time and peak memory per node (latest)", region, app, _training(
            "stats latest(log_processed.step_time_s) as step_time_s, max(log_processed.memory_gib) as memory_gib by log_processed.job, log_processed.node_rank", "step"), view="table"),
    ]
    for team, ns in sorted((teams or {}).items()):  # showback: what each team holds (trainctl usage: GPU-hours)
        in_ns = ' Namespace="' + ns + '"'
        gpus = _search(cluster_name, pods, "pod_gpu_request", "Maximum", in_ns)
        widgets.append(_metric_widget(f"Team {team}: GPUs requested by its pods", region, [(f"SUM({gpus})", "GPUs")]))
    if karpenter:
        widgets.append(_log_widget("GPU nodes launched by Karpenter", region, app, (
            f"filter kubernetes.namespace_name = '{KARPENTER_NAMESPACE}' and log_processed.message = 'launched nodeclaim' | stats count(*) as launched by bin(5m)"
        )))
    for i, w in enumerate(widgets):
        half = DASHBOARD_GRID_WIDTH // 2  # two widgets a row
        w.update({"x": (i % 2) * half, "y": (i // 2) * 6, "width": half, "height": 6})
    return {"widgets": widgets}


# --- components ---------------------------------------------------------------------------------


class CloudWatchObservability(pulumi.ComponentResource):
    """The add-on with its Pod Identity role and association, the log groups with retention, and
    the dashboard."""

    def __init__(self, name: str, *, settings: Settings, cluster: Cluster, gpu_aws: GpuAws, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:CloudWatchObservability", name, None, opts)
        cluster_name = cluster.name
        eks_name = cluster.eks_cluster.eks_cluster.name

        def o(*deps) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, depends_on=[d for d in deps if d is not None])

        role = aws.iam.Role(f"{name}-agent", name=agent_role_name(cluster_name), assume_role_policy=pod_identity_trust(), tags=tags, opts=o())
        policy = aws.iam.RolePolicyAttachment(f"{name}-agent", role=role.name, policy_arn=AGENT_POLICY.replace("arn:aws:", f"arn:{aws_partition(settings.region)}:", 1), opts=o())
        association = aws.eks.PodIdentityAssociation(
            f"{name}-agent", cluster_name=eks_name, namespace=AGENT_NAMESPACE, service_account=AGENT_SERVICE_ACCOUNT, role_arn=role.arn, tags=tags,
            opts=o(gpu_aws.pod_identity_agent, policy),
        )
        self.log_groups = [
            aws.cloudwatch.LogGroup(f"{name}-{kind}", name=log_group_name(cluster_name, kind), retention_in_days=settings.observability.log_retention_days, tags=tags, opts=o())
            for kind in LOG_GROUP_KINDS
        ]
        self.addon = aws.eks.Addon(
            f"{name}-addon",
            cluster_name=eks_name,
            addon_name=ADDON_NAME,
            addon_version=versions.CLOUDWATCH_OBSERVABILITY_ADDON_VERSION,
            configuration_values=json.dumps(addon_configuration(), sort_keys=True),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=tags,
            # its agents need their credentials and find their log groups (with retention) in place
            opts=o(association, *self.log_groups, *cluster.node_groups.values()),
        )
        body = dashboard_body(
            cluster_name=cluster_name, region=settings.region, training_namespaces=settings.training_namespaces(), karpenter=settings.gpu_pool.mode == "karpenter",
            teams={team: settings.tenants.namespace_of(team) for team in settings.tenants.teams()},
        )
        self.dashboard = aws.cloudwatch.Dashboard(f"{name}-dashboard", dashboard_name=dashboard_name(cluster_name), dashboard_body=json.dumps(body, sort_keys=True), opts=o())
        self.register_outputs({"dashboard": dashboard_name(cluster_name), "logGroups": [log_group_name(cluster_name, k) for k in LOG_GROUP_KINDS]})
