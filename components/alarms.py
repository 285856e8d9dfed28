"""Alarms: the platform says when something needs a person, on an SNS topic the stack owns
(``observability.alarms``: e-mail and HTTPS subscriptions). In ``observability.mode: cloudwatch``:

- **failed TrainJobs** and **stalled TrainJobs**: metric filters on the application log group
  (Fluent Bit, the add-on's) count the programs' ``failed`` and ``stalled`` metric lines
  (workloads/programs/trainlib.py): one is enough;
- **GPUs held idle**: Container Insights' ``node_gpu_utilization`` (enhanced observability, NVIDIA
  GPU metrics: CloudWatch User Guide, "Amazon EKS and Kubernetes Container Insights with enhanced
  observability metrics"), averaged over the cluster, below ``idleGpuPercent`` for
  ``idleMinutes``; no GPU node, no data, no alarm;
- **GPU nodes not ready**: Container Insights' ``cluster_failed_node_count`` above 0 for 10 min.

In ``prometheus`` mode the same as PrometheusRule alerts (manifests/alerts.py).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from components.observability import METRICS_NAMESPACE, log_group_name
from config.names import METRIC_ALARM, METRIC_FILTER, SNS_TOPIC
from config.settings import Settings

TRAINING_METRICS_NAMESPACE = "TrainingPlatform"
# The dimension sets the CloudWatch agent publishes Container Insights metrics under (the EMF
# exporter's metric declarations, aws/amazon-cloudwatch-agent translator/translate/otel/exporter/
# awsemf/kubernetes.go): cluster_failed_node_count only under {ClusterName}; node_gpu_utilization
# (with enhanced_container_insights and accelerated_compute_metrics on, as the observability add-on
# configures) under {ClusterName}, {ClusterName, NodeName, InstanceId} and one with GpuDevice. An
# alarm's dimensions must be one of those sets exactly, or it watches a metric that never exists.
CONTAINER_INSIGHTS_DIMENSIONS = {
    "cluster_failed_node_count": [("ClusterName",)],
    "node_gpu_utilization": [("ClusterName",), ("ClusterName", "NodeName", "InstanceId"), ("ClusterName", "NodeName", "InstanceId", "InstanceType", "GpuDevice")],
}
# the words the programs print with a failed or stalled metric line (workloads/programs/trainlib.py ALERT_TOKENS)
ALERT_TOKENS = {"failed": "TRAINING_PLATFORM_JOB_FAILED", "stalled": "TRAINING_PLATFORM_JOB_STALLED"}


def metric_filters(cluster_name: str) -> dict[str, dict[str, Any]]:
    """Log metric filters on the application log group: name -> pattern and metric."""
    return {
        kind: {
            "log_group_name": log_group_name(cluster_name, "application"),
            # Fluent Bit ships the container's line in the record's "log" field, its quotes escaped:
            # the filter looks for a word of the line (trainlib.ALERT_TOKENS), a quoted term
            # matching wherever it appears in the event (CloudWatch Logs, "Filter pattern syntax")
            "pattern": f'"{ALERT_TOKENS[kind]}"',
            "metric": {"name": f"TrainJobs{kind.capitalize()}", "namespace": TRAINING_METRICS_NAMESPACE, "value": "1", "dimensions": {}},
        }
        for kind in ("failed", "stalled")
    }


def alarm_specs(settings: Settings, cluster_name: str) -> dict[str, dict[str, Any]]:
    """Each alarm's metric, statistic, threshold and periods (what the tests check)."""
    a = settings.observability.alarms
    periods = max(1, a.idle_minutes // 10)
    return {
        "trainjobs-failed": {
            "description": "a TrainJob failed for good (a non-retryable exit: bad arguments, config or data)",
            "namespace": TRAINING_METRICS_NAMESPACE, "metric_name": "TrainJobsFailed", "dimensions": {},
            "statistic": "Sum", "period": 300, "evaluation_periods": 1, "comparison_operator": "GreaterThanOrEqualToThreshold", "threshold": 1, "treat_missing_data": "notBreaching",
        },
        "trainjobs-stalled": {
            "description": "a TrainJob made no step progress for its stall timeout (a hung collective or node)",
            "namespace": TRAINING_METRICS_NAMESPACE, "metric_name": "TrainJobsStalled", "dimensions": {},
            "statistic": "Sum", "period": 300, "evaluation_periods": 1, "comparison_operator": "GreaterThanOrEqualToThreshold", "threshold": 1, "treat_missing_data": "notBreaching",
        },
        "gpus-idle": {
            "description": f"GPU nodes' average utilization below {a.idle_gpu_percent}% for {periods * 10} min: GPUs held by jobs (or nodes) that do not use them",
            "namespace": METRICS_NAMESPACE, "metric_name": "node_gpu_utilization", "dimensions": {"ClusterName": cluster_name},
            "statistic": "Average", "period": 600, "evaluation_periods": periods, "comparison_operator": "LessThanThreshold", "threshold": a.idle_gpu_percent, "treat_missing_data": "notBreaching",
        },
        "nodes-not-ready": {
            "description": "nodes not ready for 10 min (node repair replaces GPU nodes; look if it does not)",
            "namespace": METRICS_NAMESPACE, "metric_name": "cluster_failed_node_count", "dimensions": {"ClusterName": cluster_name},
            "statistic": "Maximum", "period": 300, "evaluation_periods": 2, "comparison_operator": "GreaterThanThreshold", "threshold": 0, "treat_missing_data": "notBreaching",
        },
    }


class Alarms(pulumi.ComponentResource):
    """The SNS topic (encrypted with the AWS-managed key), its subscriptions, the log metric
    filters and the CloudWatch alarms. ``depends_on``: the log groups the filters read."""

    def __init__(self, name: str, *, settings: Settings, cluster_name: str, log_groups: list[pulumi.Resource], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:Alarms", name, None, opts)
        o = pulumi.ResourceOptions(parent=self)
        a = settings.observability.alarms
        self.topic = aws.sns.Topic(f"{name}-topic", name=SNS_TOPIC.name(cluster_name, "alarms"), kms_master_key_id="alias/aws/sns", tags=tags, opts=o)
        for i, email in enumerate(a.emails):
            aws.sns.TopicSubscription(f"{name}-email-{i}", topic=self.topic.arn, protocol="email", endpoint=email, opts=o)
        for i, url in enumerate(a.https_endpoints):
            # a webhook's URL carries its secret (a token in the path, or user:password@host):
            # a Pulumi secret, encrypted in the state and masked in previews
            aws.sns.TopicSubscription(f"{name}-https-{i}", topic=self.topic.arn, protocol="https", endpoint=pulumi.Output.secret(url), opts=o)
        for kind, f in metric_filters(cluster_name).items():
            aws.cloudwatch.LogMetricFilter(
                f"{name}-{kind}", name=METRIC_FILTER.name(cluster_name, "trainjobs", kind), log_group_name=f["log_group_name"], pattern=f["pattern"],
                metric_transformation=aws.cloudwatch.LogMetricFilterMetricTransformationArgs(name=f["metric"]["name"], namespace=f["metric"]["namespace"], value=f["metric"]["value"]),
                opts=pulumi.ResourceOptions(parent=self, depends_on=log_groups),
            )
        self.alarms = {}
        for key, spec in alarm_specs(settings, cluster_name).items():
            self.alarms[key] = aws.cloudwatch.MetricAlarm(
                f"{name}-{key}", name=METRIC_ALARM.name(cluster_name, key), alarm_description=spec["description"], namespace=spec["namespace"], metric_name=spec["metric_name"],
                dimensions=spec["dimensions"] or None, statistic=spec["statistic"], period=spec["period"], evaluation_periods=spec["evaluation_periods"],
                comparison_operator=spec["comparison_operator"], threshold=spec["threshold"], treat_missing_data=spec["treat_missing_data"],
                alarm_actions=[self.topic.arn], ok_actions=[self.topic.arn], tags=tags, opts=o,
            )
        self.register_outputs({"topic": self.topic.arn, "alarms": list(self.alarms)})
