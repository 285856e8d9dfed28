"""What a training run needs of the platform it runs on, as one value: :class:`JobPlatform`.

Three places build a run's objects with the same builders (``workloads/builders/trainjobs.py``
:func:`~workloads.builders.trainjobs.run_objects`), each with the facts it has:

* the platform's own ``trainjobs.<job>`` toggles: :func:`of_settings` (the stack's settings);
* a TrainJob stack (``workloads/``): :func:`from_document`, the document the platform exports as
  ``jobPlatform`` (:func:`document`), read through a StackReference;
* ``trainctl submit``: the facts it reads from the cluster and its flags.

:func:`run_problems` says, one line per problem, what a run asks of a platform that the platform
lacks (a runtime, a pool for its instance type, EFA in its zone, a Trainer field, Kueue).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from config.efa import efa_layouts
from config.effect_rules import job_priority_problems
from config.job_models import JobBase
from config.schema import ConfigError
from config.settings import Settings, job_capacity_problems, job_efa_zone_problems, job_grace_periods, job_lifecycle_problems
from k8s.builders.images import from_docker_hub
from k8s.builders.kueue import Pool, pools
from k8s.builders.runtimes import runtime_names, variant_key_for
from k8s.builders.tenants import CHECKPOINT_CLAIM, LOCAL_QUEUE

DOCUMENT_VERSION = 1
"""The version of the ``jobPlatform`` output's shape (a run stack refuses another)."""


@dataclass(frozen=True)
class _EfaTypes:
    instance_types: tuple[str, ...]


@dataclass(frozen=True)
class JobPlatform:
    """The platform facts a run's ConfigMap and TrainJob are built from."""

    trainer_version: str
    namespace: str
    runtime_names: Mapping[str, str]  # runtime key (base name or grace variant) -> its current (content-hashed) name
    default_grace: int  # trainer.terminationGraceSeconds: the base runtimes' grace period
    pools: tuple[Pool, ...] = ()  # the GPU pools (gpu-pool first, then the EFA pools)
    efa_zone: str | None = None  # None: no EFA pool
    efa_types: tuple[str, ...] = ()  # efa.instanceTypes, in the stack's order (the pools' layouts)
    queue: str | None = None  # the jobs' LocalQueue (Kueue on), else None
    hf_token_secret: str | None = None
    image: str | None = None  # the training image the platform built (<repo>@<digest>), if any
    image_copies: Mapping[str, str] = field(default_factory=dict)  # upstream image -> the platform's ECR copy
    checkpoint_claim: str = CHECKPOINT_CLAIM

    @property
    def efa_enabled(self) -> bool:
        return self.efa_zone is not None or bool(self.efa_types)

    def efa_pool_of(self, instance_type: str) -> str | None:
        """The EFA pool that launches ``instance_type`` (config/efa.py efa_pool_of), or None."""
        if not self.efa_enabled:
            return None
        return next((name for name, types in efa_layouts(_EfaTypes(self.efa_types)).items() if instance_type in types), None)

    def runtime_key(self, base: str, grace: int | None) -> str:
        """The runtime a job on ``base`` with ``grace`` runs on (k8s/builders/runtimes.py variant_key)."""
        return variant_key_for(base, grace, self.default_grace)

    @staticmethod
    def runtime_key_of(base: str, grace: int | None, default_grace: int) -> str:
        return variant_key_for(base, grace, default_grace)

    def kueue(self) -> bool:
        return self.queue is not None


def of_settings(settings: Settings, *, queue: bool | None = None, runtimes: Mapping[str, str] | None = None, image: Any = None, image_copies: Mapping[str, Any] | None = None) -> JobPlatform:
    """The facts of a platform stack from its settings. ``queue``: whether its jobs go through
    Kueue (default: Kueue on); ``runtimes``: the runtime names as registered (default: computed
    from the settings, the same function)."""
    kueue_on = settings.kueue_enabled if queue is None else queue
    return JobPlatform(
        trainer_version=settings.trainer.version,
        namespace=settings.trainjobs.namespace,
        runtime_names=dict(runtimes) if runtimes is not None else runtime_names(settings.trainer, job_grace_periods(settings)),
        default_grace=settings.trainer.termination_grace_seconds,
        pools=tuple(pools(settings)),
        efa_zone=settings.efa.availability_zone if settings.efa.enabled else None,
        efa_types=tuple(settings.efa.instance_types) if settings.efa.enabled else (),
        queue=LOCAL_QUEUE if kueue_on else None,
        hf_token_secret=settings.trainjobs.hf_token_secret,
        image=image,
        image_copies=dict(image_copies or {}),
    )


def document(p: JobPlatform) -> dict[str, Any]:
    """The ``jobPlatform`` stack output (plain JSON; values may be Pulumi outputs when exported)."""
    return {
        "version": DOCUMENT_VERSION,
        "trainerVersion": p.trainer_version,
        "namespace": p.namespace,
        "checkpointClaim": p.checkpoint_claim,
        "runtimes": dict(p.runtime_names),
        "defaultGraceSeconds": p.default_grace,
        "pools": [{"name": x.name, "instanceTypes": list(x.instance_types), "gpuLimit": x.gpu_limit, "efa": x.efa} for x in p.pools],
        "efa": {"zone": p.efa_zone, "instanceTypes": list(p.efa_types)} if p.efa_enabled else None,
        "queue": p.queue,
        "hfTokenSecret": p.hf_token_secret,
        "image": p.image,
        "imageCopies": dict(p.image_copies),
    }


class DocumentError(ValueError):
    """The platform's output is missing or of another shape (one line)."""


def from_document(doc: Any, stack: str) -> JobPlatform:
    """The facts a platform stack exported as ``jobPlatform``; :class:`DocumentError` when it
    exported none (an older platform, or one without the training namespace) or another version."""
    if not isinstance(doc, Mapping):
        raise DocumentError(
            f"platform stack {stack} exports no jobPlatform output: update it (pulumi up of the platform), and give it the training namespace and checkpoint volume (a trainjobs.<job> enabled)"
        )
    if doc.get("version") != DOCUMENT_VERSION:
        raise DocumentError(f"platform stack {stack} exports jobPlatform version {doc.get('version')!r}; this program reads version {DOCUMENT_VERSION}: update the platform stack")
    efa = doc.get("efa") or {}
    return JobPlatform(
        trainer_version=doc["trainerVersion"],
        namespace=doc["namespace"],
        checkpoint_claim=doc.get("checkpointClaim") or CHECKPOINT_CLAIM,
        runtime_names=dict(doc.get("runtimes") or {}),
        default_grace=int(doc["defaultGraceSeconds"]),
        pools=tuple(Pool(x["name"], tuple(x["instanceTypes"]), int(x["gpuLimit"]), bool(x["efa"])) for x in doc.get("pools") or []),
        efa_zone=efa.get("zone"),
        efa_types=tuple(efa.get("instanceTypes") or ()),
        queue=doc.get("queue"),
        hf_token_secret=doc.get("hfTokenSecret"),
        image=doc.get("image"),
        image_copies=dict(doc.get("imageCopies") or {}),
    )


def run_problems(key: str, job: JobBase, p: JobPlatform, *, stack: str = "the platform") -> Iterator[ConfigError]:
    """What ``job`` (config key ``key``: ddp, fsdp, tf, ncclCheck) asks of platform ``p`` that it
    lacks, one :class:`ConfigError` each. The checks are the platform's own rules on its jobs
    (config/settings.py), given the platform's facts instead of its settings."""
    runtime = p.runtime_key(type(job).RUNTIME, job.termination_grace_seconds)
    if runtime not in p.runtime_names:
        offered = ", ".join(sorted(p.runtime_names)) or "none"
        where = f"{key}.terminationGraceSeconds" if runtime != type(job).RUNTIME else key
        yield ConfigError(where, job.termination_grace_seconds if where.endswith("Seconds") else type(job).RUNTIME, f"{stack} has no runtime {runtime} (it has: {offered}); allowed: a runtime the platform installs (trainer.runtimes, trainer.graceClasses)")
    types = {t for pool in p.pools for t in pool.instance_types}
    efa_pool = p.efa_pool_of(job.instance_type)
    limit = next((x.gpu_limit for x in p.pools if x.name == efa_pool), None) if efa_pool else next((x.gpu_limit for x in p.pools if not x.efa), 0)
    limit_key = f"the {efa_pool} pool's GPU limit" if efa_pool else "gpuPool.gpuLimit"
    yield from job_capacity_problems(key, job, sorted(types), limit or 0, limit_key)
    yield from job_efa_zone_problems(key, job, p.efa_zone if p.efa_enabled else None, p.efa_types)
    yield from job_lifecycle_problems(key, job, p.trainer_version)
    if job.image is None and p.image is None:
        yield ConfigError(f"{key}.image", None, f"{stack} built no training image (every job of its own names one); allowed: an image with a pinned tag or digest")
    elif job.image is not None and "image" not in job.model_fields_set and from_docker_hub(job.image) and job.image not in p.image_copies:
        # the default is a Docker Hub image: the nodes pull the platform's ECR copy (infra/registry.py ImageMirror)
        yield ConfigError(f"{key}.image", job.image, f"{stack} has no ECR copy of this default image; allowed: an image with a pinned tag or digest the nodes can pull")
    yield from job_priority_problems(key, job, kueue_enabled=p.kueue())
