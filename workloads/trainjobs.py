"""TrainJobs from stack config: namespace, code ConfigMap, checkpoint volume, TrainJobs."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pulumi_kubernetes as kube
from pulumi.runtime.sync_await import _sync_await

import versions
from config.job_models import JobBase
from config.schema import ConfigErrors
from config.settings import Settings
from infra.registry import ImageMirror
from infra.storage import CheckpointStorage
from k8s.builders import kueue as kq
from k8s.builders import tenants as tn
from k8s.builders import trainer_api
from k8s.builders.volume_setup import checkpoint_owner_job
from k8s.kueue import Kueue
from k8s.resources import apply_manifest
from k8s.trainer import Trainer
from workloads.builders import job_platform
from workloads.builders import trainjobs as tj
from workloads.builders.job_platform import JobPlatform

PLATFORM_OUTPUT = "jobPlatform"
"""The platform stack's output a TrainJob stack reads (workloads/builders/job_platform.py document)."""


class TrainJobs(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        trainer: Trainer,
        storage: CheckpointStorage,
        capacity: list[pulumi.Resource],
        provider: kube.Provider,
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

        # the facts a run is built from: the same function builds a TrainJob stack's run (workloads/__main__.py)
        self.platform = job_platform.of_settings(settings, queue=kueue is not None, runtimes=trainer.runtime_names)
        files = tj.code_files()
        built = {key: tj.run_objects(tj.WORKLOADS[key], job, self.platform, files=files, image=tj.run_image(job, image, images.copy if images is not None else None))
                 for key, job in settings.trainjobs.jobs().items()}
        # objects the API server cannot store are refused before any of them is registered (the check trainctl makes)
        if too_big := [p for key, objects in built.items() for p in tj.size_problems(f"trainjobs.{key}", settings.trainjobs.jobs()[key], objects)]:
            raise pulumi.RunError(str(ConfigErrors(too_big)))
        ns = apply_manifest(tj.namespace(ns_name), o())
        if settings.tenants.teams():
            # with teams on the cluster, the stack's jobs are fenced like a team's (their rendezvous
            # ports closed to other namespaces, no path to the nodes' credentials)
            labels = {"training-platform/component": "trainjobs"}
            for policy in (tn.ingress_policy(ns_name, labels, name="namespace-isolation"), tn.egress_policy(ns_name, labels, trainer_status=trainer_api.status_server_on(settings.trainer))):
                apply_manifest(policy, o(ns))
        code = apply_manifest(tj.code_configmap(ns_name, files), o(ns))
        pv_manifest, pvc_manifest = tn.checkpoint_volume(
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
            runtime_key = tj.runtime_key(tj.WORKLOADS[key], job, self.platform)  # its runtime, or that runtime's variant with the job's grace period
            runtime = trainer.runtimes[runtime_key]  # config refuses a job whose runtime is not installed
            _, manifest = built[key]
            # TrainJob specs are (mostly) immutable: any change (a new image digest too) replaces the job, deleting the
            # old one first. So does a label change: Kueue v0.19.2 refuses a queue-name change on a running job
            # (pkg/controller/jobframework/validation.go validateUpdateForQueueName) and adds its runtime patch only
            # when a job is created (trainjob_webhook.go Default), so turning Kueue on re-creates the jobs (they resume
            # from their checkpoints). Depending on the runtime and the node pools makes destroy remove
            # the job (and its pods) before either.
            self.jobs[key] = apply_manifest(manifest, o(runtime, code, pvc, owner, *capacity, *queue, replace_on_changes=["spec", "metadata.labels"], delete_before_replace=True))
        self.names = [tj.WORKLOADS[k].name for k in self.jobs]
        self.register_outputs({"trainJobs": self.names})

    def platform_document(self, image: pulumi.Input[str] | None, image_copies: dict[str, pulumi.Output[str]]) -> dict:
        """The ``jobPlatform`` output: what a TrainJob stack (workloads/) reads of this platform (its
        jobs' namespace and claim, runtimes, queue, pools, EFA, Trainer version, the built image and
        the ECR copies of the default images)."""
        return job_platform.document(dataclasses.replace(self.platform, image=image, image_copies=image_copies))


class PlatformReference:
    """The platform stack a TrainJob stack runs on: a ``pulumi.StackReference`` to it, its
    ``jobPlatform`` output read as :class:`~workloads.builders.job_platform.JobPlatform` (before anything of
    the run is registered, so a run the platform cannot take registers nothing), and a Kubernetes
    provider from its ``kubeconfig`` output (server-side apply, as the platform's own provider)."""

    def __init__(self, name: str, stack: str):
        self.name, self.stack = name, stack
        self.ref = pulumi.StackReference(name, stack_name=stack)

    def facts(self) -> JobPlatform:
        # a stack reference's outputs are read while the program runs (pulumi preview too); the value
        # is awaited here as Pulumi's own synchronous invokes are (pulumi/runtime/sync_await.py)
        details = _sync_await(self.ref.get_output_details(PLATFORM_OUTPUT))
        doc = details.value if details.value is not None else details.secret_value
        return job_platform.from_document(doc, self.stack)

    def provider(self) -> kube.Provider:
        kubeconfig = self.ref.require_output("kubeconfig").apply(lambda k: k if isinstance(k, str) else json.dumps(k))
        return kube.Provider(f"{self.name}-k8s", kubeconfig=pulumi.Output.secret(kubeconfig), enable_server_side_apply=True, delete_unreachable=False)


class TrainJobRun(pulumi.ComponentResource):
    """One run of a TrainJob stack (``workloads/``): its code ConfigMap and its TrainJob, built by
    :func:`workloads.builders.trainjobs.run_objects` (as the platform's ``trainjobs.<job>``) from the job
    model and the facts of the platform stack it runs on; nothing of the platform is registered."""

    def __init__(self, name: str, *, key: str, job: JobBase, platform: JobPlatform, provider: kube.Provider, trainjob_name: str, opts: pulumi.ResourceOptions | None = None):
        """``trainjob_name``: the run's own (never the platform's job of that kind: its checkpoints are its own)."""
        super().__init__("training-platform:workloads:TrainJobRun", name, None, opts)
        workload = dataclasses.replace(tj.WORKLOADS[key], name=trainjob_name)
        configmap, manifest = self.objects(key, job, platform, trainjob_name)
        code = apply_manifest(configmap, pulumi.ResourceOptions(parent=self, provider=provider))
        # replaced on any change, the old job deleted first (as the platform's jobs: TrainJobs above)
        self.trainjob = apply_manifest(manifest, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[code], replace_on_changes=["spec", "metadata.labels"], delete_before_replace=True))
        self.name = workload.name
        self.namespace = platform.namespace
        self.register_outputs({"trainJob": self.name, "namespace": self.namespace})

    @staticmethod
    def objects(key: str, job: JobBase, platform: JobPlatform, trainjob_name: str) -> tuple[dict, dict]:
        """The run's code ConfigMap and TrainJob (workloads/__main__.py checks them before registering)."""
        workload = dataclasses.replace(tj.WORKLOADS[key], name=trainjob_name)
        image = tj.run_image(job, platform.image, lambda ref: platform.image_copies[ref])  # job_platform.run_problems refuses a missing copy
        return tj.run_objects(workload, job, platform, files=tj.code_files(), image=image, code_prefix=f"{trainjob_name}-code")
