"""Kubeflow Trainer: the pinned Helm release and our ClusterTrainingRuntimes.

Install mechanism: ``helm.v3.Release`` (a plain Pulumi resource, not the remote Chart
component). Helm installs the CRDs with the chart and, with ``skip_await`` off, the release
completes only when the controller and its webhook Deployment are ready; every runtime
``depends_on`` the release, so none is sent before the webhook serves (a runtime applied too
early is rejected by ``failed calling webhook``). On a first ``pulumi preview`` against an empty
account there is no cluster, the Kubernetes provider is unknown, and pulumi-kubernetes previews
the runtimes without looking their CRD up on a server, so preview cannot fail on a missing CRD.
The controller owns its webhook certificate Secret and the webhook ``caBundle``; Helm's
three-way merge leaves fields the chart does not set, so those are never fought over.

Destroy order comes from the same edges: TrainJobs depend on the runtimes, the runtimes on the
release, so TrainJobs go first and v2.1's finalizer on referenced runtimes is released before the
runtimes are deleted, and the controller outlives both.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as kube

import versions
from config.namespaces import TRAINER_NAMESPACE  # noqa: F401  (part of this module's interface)
from config.settings import TrainerSettings
from infra import deploy_state
from infra.registry import ImageMirror
from k8s.builders.runtimes import runtimes, trainer_chart_values
from k8s.helm import release
from k8s.resources import apply_manifest


class Trainer(pulumi.ComponentResource):
    runtimes: dict[str, pulumi.Resource]
    runtime_names: dict[str, str]

    def __init__(
        self, name: str, *, settings: TrainerSettings, cluster_name: str, provider: kube.Provider, depends_on: list[pulumi.Resource] | None = None, opts: pulumi.ResourceOptions | None = None,
        job_graces: dict[str, list[int]] | None = None, images: ImageMirror | None = None,
    ):
        super().__init__("training-platform:k8s:Trainer", name, None, opts)
        self.version = settings.version
        self.release = release(
            "kubeflow-trainer",
            chart=versions.TRAINER_CHART,
            version=versions.TRAINER_VERSIONS[settings.version]["chart"],
            namespace=TRAINER_NAMESPACE,
            create_namespace=True,
            values=trainer_chart_values(settings),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=depends_on or []),
        )
        manifests = runtimes(settings, job_graces)  # job_graces: the stack's jobs' grace periods (config.settings.job_grace_periods)
        # keyed by base name (torch-distributed-gpu, ...) or grace variant (<base>-grace<N>); the objects carry content-hashed names
        if images is not None:  # the stack's ECR copies in place of the Docker Hub images they name (infra/registry.py)
            manifests = {base: images.resolve(obj) for base, obj in manifests.items()}
        self.runtime_names = {base: obj["metadata"]["name"] for base, obj in manifests.items()}
        self.runtimes = {
            base: apply_manifest(obj, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.release]))
            for base, obj in manifests.items()
        }
        # the installed release, read back by the next deploy (infra/deploy_state.py); written only
        # once the release has been installed or upgraded
        self.installed = aws.ssm.Parameter(
            f"{name}-version",
            name=deploy_state.parameter_name(cluster_name, deploy_state.TRAINER_VERSION),
            type="String",
            value=settings.version,
            description="Kubeflow Trainer release installed on the cluster",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.release]),
        )
        self.register_outputs({"version": self.version, "runtimes": self.runtime_names})
