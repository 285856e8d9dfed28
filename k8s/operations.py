"""The platform-ops namespace, the deploy-time GPU smoke check and the cleanup of finished
TrainJobs (builders: ``k8s/builders/operations.py``; the programs: ``k8s/pods/``)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kube

from config.settings import Settings
from infra.registry import ImageMirror
from k8s.builders.operations import (
    CLEANUP,
    CLEANUP_SCRIPT,
    FENCE,
    FENCE_SCRIPT,
    SMOKE_CHECK,
    SMOKE_CHECK_SCRIPT,
    SMOKE_CHECK_TIMEOUT,
    cleanup_cronjob,
    cleanup_rbac,
    fence_cronjob,
    fence_rbac,
    ops_namespace,
    ops_network_policy,
    script_configmap,
    smoke_check_job,
)
from k8s.resources import apply_manifest


class Operations(pulumi.ComponentResource):
    """The ops namespace, the GPU smoke check (``smokeChecks.enabled``; ``pulumi up`` waits for the
    Job to complete: pulumi-kubernetes' Job await, up to SMOKE_CHECK_TIMEOUT), the cleanup of
    finished TrainJobs every 10 minutes (with ``trainjobs.finishedJobRetention`` Never too: a job
    may still ask for its own, ``trainctl submit --ttl``) and the
    fence of nodes a preflight failed on."""

    def __init__(
        self, name: str, *, settings: Settings, provider: kube.Provider, gpu_ready: list[pulumi.Resource], trainer: pulumi.Resource, keep_kinds: list[str], job_label: str,
        opts: pulumi.ResourceOptions | None = None, images: ImageMirror | None = None,
    ):
        super().__init__("training-platform:k8s:Operations", name, None, opts)

        def o(*deps, **kw) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(deps), **kw)

        self.smoke_check: pulumi.Resource | None = None
        ns = apply_manifest(ops_namespace(), o())
        apply_manifest(ops_network_policy(), o(ns))
        if settings.smoke_checks.enabled:
            cm = script_configmap(SMOKE_CHECK, SMOKE_CHECK_SCRIPT)
            code = apply_manifest(cm, o(ns))
            job = smoke_check_job(settings, configmap=cm["metadata"]["name"])
            job = images.resolve(job) if images is not None else job  # the stack's ECR copy of its Docker Hub image
            # a Job's template is immutable: a changed check replaces it (and runs it again)
            self.smoke_check = apply_manifest(
                job, o(ns, code, *gpu_ready, replace_on_changes=["spec"], delete_before_replace=True, custom_timeouts=pulumi.CustomTimeouts(create=SMOKE_CHECK_TIMEOUT, update=SMOKE_CHECK_TIMEOUT))
            )
        cm = script_configmap(CLEANUP, CLEANUP_SCRIPT)
        code = apply_manifest(cm, o(ns))
        rbac = [apply_manifest(m, o(ns)) for m in cleanup_rbac()]
        self.cleanup = apply_manifest(cleanup_cronjob(settings, configmap=cm["metadata"]["name"], keep_kinds=keep_kinds, job_label=job_label), o(ns, code, trainer, *rbac))
        # the nodes a preflight failed on are tainted, so the restarted job lands elsewhere
        cm = script_configmap(FENCE, FENCE_SCRIPT)
        code = apply_manifest(cm, o(ns))
        rbac = [apply_manifest(m, o(ns)) for m in fence_rbac()]
        self.fence = apply_manifest(fence_cronjob(configmap=cm["metadata"]["name"]), o(ns, code, *rbac))
        self.register_outputs({"smokeCheck": SMOKE_CHECK if self.smoke_check else None})
