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

In ``prometheus`` mode the same as PrometheusRule alerts (k8s/builders/alerts.py).

The topic is encrypted with a customer-managed key of its own (infra/encryption.py): with
the AWS-managed ``alias/aws/sns`` key CloudWatch cannot publish, and every alarm action fails
("Failed to execute action" in the alarm history). Its policy and the topic's let
``cloudwatch.amazonaws.com`` write only for this account's alarms of this stack: CloudWatch
publishes as that service principal with ``aws:SourceArn`` = the alarm's ARN,
``arn:<partition>:cloudwatch:<region>:<account>:alarm:<name>`` (AWS re:Post Knowledge Center,
"Why didn't I receive an SNS notification for my CloudWatch alarm trigger?": the error names the
alarm ARN and the fix grants that principal ``sns:Publish`` with ``aws:SourceArn``; Service
Authorization Reference, Amazon CloudWatch: the alarm ARN format).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from config.names import METRIC_ALARM, METRIC_FILTER, SNS_TOPIC
from config.settings import Settings
from infra.encryption import Writer, customer_key, dumps, key_policy
from infra.gpu_aws import aws_partition
from infra.observability import METRICS_NAMESPACE, log_group_name

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


# What the topic's owner may do under SNS's default topic policy (SNS Developer Guide, "Example
# cases for Amazon SNS access control"), kept when the topic gets a policy of its own.
OWNER_TOPIC_ACTIONS = [
    "sns:GetTopicAttributes", "sns:SetTopicAttributes", "sns:AddPermission", "sns:RemovePermission",
    "sns:DeleteTopic", "sns:Subscribe", "sns:ListSubscriptionsByTopic", "sns:Publish",
]


def alarm_arn(*, partition: str, region: str, account: str, alarm_name: str) -> str:
    return f"arn:{partition}:cloudwatch:{region}:{account}:alarm:{alarm_name}"


def topic_policy(*, topic_arn: str, partition: str, account: str, alarm_arns: list[str]) -> dict:
    """The alarm topic's access policy: the owner account as under the default policy, and
    CloudWatch for this stack's alarms only (aws:SourceAccount, aws:SourceArn)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "OwnerAccount", "Effect": "Allow", "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"}, "Action": list(OWNER_TOPIC_ACTIONS), "Resource": topic_arn},
            {
                "Sid": "CloudWatchAlarmsPublish", "Effect": "Allow", "Principal": {"Service": "cloudwatch.amazonaws.com"}, "Action": "sns:Publish", "Resource": topic_arn,
                "Condition": {"StringEquals": {"aws:SourceAccount": account}, "ArnLike": {"aws:SourceArn": sorted(alarm_arns)}},
            },
        ],
    }


class Alarms(pulumi.ComponentResource):
    """The SNS topic (encrypted with a key of its own that lets the alarms publish), its policy
    and subscriptions, the log metric filters and the CloudWatch alarms. ``depends_on``: the log
    groups the filters read."""

    def __init__(self, name: str, *, settings: Settings, cluster_name: str, log_groups: Sequence[pulumi.Resource], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:Alarms", name, None, opts)
        o = pulumi.ResourceOptions(parent=self)
        a = settings.observability.alarms
        specs = alarm_specs(settings, cluster_name)
        names = {key: METRIC_ALARM.name(cluster_name, key) for key in specs}
        partition, region = aws_partition(settings.region), settings.region
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(parent=self)).account_id

        def arns(acct: str) -> list[str]:
            return [alarm_arn(partition=partition, region=region, account=acct, alarm_name=n) for n in names.values()]

        self.key = customer_key(
            f"{name}-key", description=f"SNS alarms topic of {cluster_name}: CloudWatch alarms publish with it",
            policy=account.apply(lambda acct: dumps(key_policy(partition=partition, account=acct, writers=[Writer("cloudwatch.amazonaws.com", tuple(arns(acct)))]))),
            tags=tags, opts=o,
        )
        self.topic = aws.sns.Topic(f"{name}-topic", name=SNS_TOPIC.name(cluster_name, "alarms"), kms_master_key_id=self.key.arn, tags=tags, opts=o)
        topic_access = aws.sns.TopicPolicy(
            f"{name}-topic", arn=self.topic.arn,
            policy=pulumi.Output.all(self.topic.arn, account).apply(lambda a: dumps(topic_policy(topic_arn=a[0], partition=partition, account=a[1], alarm_arns=arns(a[1])))),
            opts=o,
        )
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
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(log_groups)),
            )
        self.alarms = {}
        for key, spec in specs.items():
            self.alarms[key] = aws.cloudwatch.MetricAlarm(
                f"{name}-{key}", name=names[key], alarm_description=spec["description"], namespace=spec["namespace"], metric_name=spec["metric_name"],
                dimensions=spec["dimensions"] or None, statistic=spec["statistic"], period=spec["period"], evaluation_periods=spec["evaluation_periods"],
                comparison_operator=spec["comparison_operator"], threshold=spec["threshold"], treat_missing_data=spec["treat_missing_data"],
                alarm_actions=[self.topic.arn], ok_actions=[self.topic.arn], tags=tags,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[topic_access]),  # their first OK action finds the access in place
            )
        self.register_outputs({"topic": self.topic.arn, "alarms": list(self.alarms)})
