"""TrainJobs from stack config: namespace, code ConfigMap, checkpoint volume, TrainJobs."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

import versions
from components.kueue import Kueue
from components.registry import ImageMirror
from components.resources import apply_manifest
from components.storage import CheckpointStorage
from components.trainer import Trainer
from config.settings import Settings
from manifests import kueue as kq
from manifests import tenants as tn
from manifests import trainer_api
from manifests import trainjobs as tj
from manifests.images import from_docker_hub
from manifests.tenants import LOCAL_QUEUE
from manifests.volume_setup import checkpoint_owner_job


class TrainJobs(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        trainer: Trainer,
        storage: CheckpointStorage,
        capacity: list[pulumi.Resource],
        provider: k8s.Provider,
        image: pulumi.Input[str] | None = None,
        kueue: Kueue | None = None,
        opts: pulumi.ResourceOptions | None = None,
        images: ImageMirror | None = None,
    ):
        """``image``: the image the stack built (``<repo>@<digest>``), for jobs that set none.
        ``kueue``: with Kueue on, the namespace gets a LocalQueue of the stack's ClusterQueue and
        the jobs carry its label (and are created only once Kueue's webhook serves). ``images``: a
        job whose image is the config's default, a Docker Hub image, runs the stack's ECR copy of it
        (an image the stack file names is used as it is)."""
        super().__init__("training-platform:workloads:TrainJobs", name, None, opts)
        ns_name = settings.trainjobs.namespace

        def o(*deps, **kw) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[d for d in deps if d is not None], **kw)

        ns = apply_manifest(tj.namespace(ns_name), o())
        if settings.tenants.teams():
            # with teams on the cluster, the stack's jobs are fenced like a team's (their rendezvous
            # ports closed to other namespaces, no path to the nodes' credentials)
            labels = {"training-platform/component": "trainjobs"}
            for policy in (tn.ingress_policy(ns_name, labels, name="namespace-isolation"), tn.egress_policy(ns_name, labels, trainer_status=trainer_api.status_server_on(settings.trainer))):
                apply_manifest(policy, o(ns))
        files = tj.code_files()
        code = apply_manifest(tj.code_configmap(ns_name, files), o(ns))
        pv_manifest, pvc_manifest = tj.checkpoint_volume(
            ns=ns_name, storage_type=storage.type, volume_handle=storage.volume_handle, capacity_gib=storage.capacity_gib,
            attributes=storage.attributes, mount_options=storage.mount_options, pv_name=storage.platform_volume_name(ns_name),
        )
        pv = apply_manifest(pv_manifest, o(storage.addon))
        # a claim's volumeName is immutable: a new volume replaces the claim (after the pods using it end)
        pvc = apply_manifest(pvc_manifest, o(ns, pv, replace_on_changes=["spec.volumeName"], delete_before_replace=True))
        # the volume's root belongs to root until this Job hands it to the non-root training user
        owner = apply_manifest(checkpoint_owner_job(ns_name, uid=int(versions.WORKLOAD_UID), image=versions.VOLUME_SETUP_IMAGE), o(pvc))
        queue: list[pulumi.Resource] = []
        if kueue is not None:
            queue = [apply_manifest(kq.local_queue(ns_name, kq.TRAINING_QUEUE), o(ns, kueue.training_queue)), *kueue.ready]
        self.jobs = {}
        for key, job in settings.trainjobs.jobs().items():
            workload = tj.WORKLOADS[key]
            job_image = job.image or image
            if images is not None and job.image is not None and "image" not in job.model_fields_set and from_docker_hub(job.image):
                job_image = images.copy(job.image)
            runtime_key = tj.runtime_key(workload, job, settings)  # its runtime, or that runtime's variant with the job's grace period
            runtime = trainer.runtimes[runtime_key]  # config refuses a job whose runtime is not installed
            manifest = tj.trainjob(workload, job, settings, code_configmap=tj.code_configmap_name(files), image=job_image, runtime_name=trainer.runtime_names[runtime_key], queue=LOCAL_QUEUE if kueue else None)
            # TrainJob specs are (mostly) immutable: any change (a new image digest too) replaces the job, deleting the
            # old one first. So does a label change: Kueue v0.19.2 refuses a queue-name change on a running job
            # (pkg/controller/jobframework/validation.go validateUpdateForQueueName) and adds its runtime patch only
            # when a job is created (trainjob_webhook.go Default), so turning Kueue on re-creates the jobs (they resume
            # from their checkpoints). Depending on the runtime and the node pools makes destroy remove
            # the job (and its pods) before either.
            self.jobs[key] = apply_manifest(manifest, o(runtime, code, pvc, owner, *capacity, *queue, replace_on_changes=["spec", "metadata.labels"], delete_before_replace=True))
        self.names = [tj.WORKLOADS[k].name for k in self.jobs]
        self.register_outputs({"trainJobs": self.names})
