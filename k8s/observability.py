"""Observability, whole: what ``observability.mode`` asks for (the AWS half, ``infra/observability.py``;
or Prometheus, ``k8s/prometheus.py``), plus the deploy-time GPU smoke check and the cleanup of
finished TrainJobs (``k8s/operations.py``).

Its type string says ``infra`` as it did before the folders were arranged by side: a component's
type is part of every child's URN, so renaming it would replace the deployed resources."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from config.settings import Settings
from infra.cluster import Cluster
from infra.gpu_aws import GpuAws
from infra.observability import CloudWatchObservability, dashboard_name
from infra.registry import ImageMirror
from k8s.builders.tenants import JOB_LABEL
from k8s.gpu_capacity import GpuCapacity
from k8s.operations import Operations
from k8s.prometheus import PrometheusMonitoring
from k8s.trainer import Trainer


class Observability(pulumi.ComponentResource):
    """What ``observability.mode`` asks for, plus the smoke check and the TrainJob cleanup."""

    def __init__(
        self, name: str, *, settings: Settings, cluster: Cluster, gpu_aws: GpuAws, capacity: GpuCapacity, trainer: Trainer, tags: dict[str, str],
        keep_kinds: Sequence[str], opts: pulumi.ResourceOptions | None = None, images: ImageMirror | None = None,
    ):
        super().__init__("training-platform:infra:Observability", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        mode = settings.observability.mode
        self.cloudwatch = CloudWatchObservability(f"{name}-cloudwatch", settings=settings, cluster=cluster, gpu_aws=gpu_aws, tags=tags, opts=child) if mode == "cloudwatch" else None
        self.prometheus = (
            PrometheusMonitoring(f"{name}-prometheus", settings=settings, provider=cluster.provider, depends_on=list(cluster.node_groups.values()), opts=child)
            if mode == "prometheus"
            else None
        )
        self.operations = Operations(
            f"{name}-ops", settings=settings, provider=cluster.provider, gpu_ready=[*capacity.node_pools, *capacity.plugins], trainer=trainer.release,
            keep_kinds=list(keep_kinds), job_label=JOB_LABEL, opts=child, images=images,
        )
        self.register_outputs({"mode": mode, "dashboard": dashboard_name(cluster.name) if self.cloudwatch else None})
