"""Kueue on the cluster: its Helm release, a ResourceFlavor per GPU pool and the stack's own
ClusterQueue (builders: ``k8s/builders/kueue.py``)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kube

import versions
from config.settings import Settings
from k8s.builders import kueue as kq
from k8s.helm import release
from k8s.resources import apply_manifest
from k8s.trainer import Trainer


class Kueue(pulumi.ComponentResource):
    """Kueue's release (after the Trainer's, whose TrainJob CRD the integration watches), a
    ResourceFlavor per GPU pool and the stack's own ClusterQueue. ``ready``: what an object of a
    Kueue kind, or a TrainJob Kueue must admit, depends on."""

    ready: list[pulumi.Resource]

    def __init__(self, name: str, *, settings: Settings, trainer: Trainer, provider: kube.Provider, opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:k8s:Kueue", name, None, opts)

        def o(*deps: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(deps))

        # Kueue 0.19.2 starts an integration whose CRD is missing only after polling for it
        # (pkg/controller/jobframework/setup.go WaitForAPI): installing after the Trainer avoids the wait.
        self.release = release(
            "kueue",
            chart=versions.KUEUE_CHART,
            version=versions.KUEUE_VERSION,
            namespace=kq.KUEUE_NAMESPACE,
            create_namespace=True,
            values=kq.chart_values(settings),
            opts=o(trainer.release),
        )
        self.flavors = [apply_manifest(kq.system_resource_flavor(), o(self.release)), *(apply_manifest(kq.resource_flavor(p), o(self.release)) for p in kq.pools(settings))]
        self.priority_classes = [apply_manifest(m, o(self.release)) for m in kq.priority_classes()]
        self.ready = [self.release, *self.flavors, *self.priority_classes]
        self.training_queue = apply_manifest(kq.training_cluster_queue(settings), o(*self.ready))
        self.register_outputs({"clusterQueue": kq.TRAINING_QUEUE, "flavors": [p.name for p in kq.pools(settings)]})
