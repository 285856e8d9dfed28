"""The ConfigMap and TrainJob ``trainctl submit`` creates, built with the stack's own builders
(``workloads/builders/trainjobs.py``): code ConfigMap naming and hash, resources per node from the GPU
catalog, EFA requests, the checkpoint volume, the queue label, and the pod customisation per
Trainer version (``k8s/builders/trainer_api.py``).

The user's command. Every argument that names a shipped file (``train.py``, ``./conf/a.yaml``)
is rewritten to its path under the code mount. On the torch runtime a ``python``/``python3``
program is started by ``torchrun`` (which takes the node count, rank, rendezvous address and
processes per node from the ``PET_*`` environment the Trainer injects: PyTorch
``torch/distributed/run.py`` reads every option's default from ``PET_<OPTION>``), one process per
GPU; any other command (``torchrun ...``, ``bash run.sh``) runs as given. On the tensorflow
runtime the command becomes the TrainJob's ``args`` under the runtime's TF_CONFIG wrapper, one
worker per node (as the stack's TF job, ``workloads.builders.trainjobs.trainer_entry``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import versions
from config import catalog, job_env, trainjob_names
from config.checks import _DURATION_RE
from config.effect_rules import RESERVED_NAMESPACE_PREFIX
from config.job_models import retention_seconds, system_namespaces
from config.schema import problems_of, repaired_section, validate_section
from config.secrets import REDACTED, looks_secret, shown, unshown_in
from config.settings import AZ_RE, DNS_LABEL_RE, KUEUE_INCOMPATIBLE_TRAINERS, TF_RUNTIME, TORCH_RUNTIME, JobBase, TrainerSettings
from k8s.builders import trainer_api
from k8s.builders.kueue import PRIORITIES
from k8s.builders.runtimes import BUILDERS, FAMILY_LABEL, GRACE_LABEL, RUNTIME_LABEL, variant_key
from k8s.builders.tenants import LOCAL_QUEUE
from trainctl import secrets
from trainctl.code import CodeBundle, object_problems
from workloads.builders import trainjobs as tj
from workloads.builders.job_platform import JobPlatform

RUNTIMES = {"torch": TORCH_RUNTIME, "tensorflow": TF_RUNTIME}
"""``--runtime`` -> the platform's ClusterTrainingRuntime (base name, k8s/builders/runtimes.py)."""
# Without --image the TrainJob names no image and the Trainer runs its runtime's: whatever image the cluster's
# runtime names, so one its nodes can pull (this platform's runtimes name its ECR copies of the pinned upstream
# images, never Docker Hub, whose anonymous pull limit every node behind one NAT address shares).
TRAINCTL_KIND = "trainctl"
"""The ``training-platform/job`` label of jobs submitted with trainctl."""
DEFAULT_INSTANCE_TYPE = "g5.xlarge"
"""``--instance-type`` where the cluster publishes no facts (k8s/builders/platform_facts.py) to take it from."""
DEPS_TIMEOUT_MIN, DEPS_TIMEOUT_MAX = 10, 7200  # --deps-timeout: pip's own socket timeout is 15 s; two hours is a build, not an install
# TrainJob names: the CRD's CEL rules (kubeflow/trainer v2.3.0 trainjob_types.go: RFC 1035 label, at most 63);
# a job that runs has a shorter one (config/trainjob_names.py: its JobSet's pod names must fit 63)
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", re.ASCII)
NAME_MAX = 63


class SubmitError(ValueError):
    """Bad input for submit (one line, for the user); nothing was created."""


@dataclass(frozen=True)
class Request:
    namespace: str
    nodes: int
    command: list[str]
    runtime: str = "torch"
    gpus_per_node: int | None = None
    instance_type: str = DEFAULT_INSTANCE_TYPE
    image: str | None = None
    name: str | None = None
    trainer_version: str = versions.DEFAULT_TRAINER_VERSION
    runtime_name: str | None = None  # the runtime's current (content-hashed) name
    queue: str | None = LOCAL_QUEUE
    efa_zone: str | None = None
    efa_types: tuple[str, ...] = ()  # every EFA type of the cluster (its pools' layouts), from its published facts
    priority: str | None = None  # Kueue WorkloadPriorityClass; None: the team's default (published facts), else normal
    grace_seconds: int | None = None  # SIGTERM to SIGKILL (the pod's terminationGracePeriodSeconds): a runtime variant's; None: the base runtime's
    env: tuple[tuple[str, str], ...] = ()  # --env NAME=VALUE: the trainer container's own variables (config/job_env.py)
    secret_env: tuple[tuple[str, str], ...] = ()  # --secret-env NAME=SECRET/KEY: variables from a Secret of the namespace (secretKeyRef)
    resume_from: str | None = None  # another job whose checkpoint directory this one starts from (read only)
    deps_timeout: int | None = None  # seconds for installing the code's requirements.txt; None: tj.DEFAULT_DEPS_TIMEOUT_S
    pip_index_url: str | None = None  # the platform's (published facts); None: PyPI
    pip_extra_index_urls: tuple[str, ...] = ()
    service_account: str | None = None  # the team's jobs' service account (published facts); None: the namespace's default
    local: bool = False  # a run on this machine (submit --local, ui --local): no cluster Secrets (config/job_env.py)
    ttl_seconds: int | None = None  # --ttl: delete the job this long after it finishes (k8s/builders/tenants.py TTL_ANNOTATION); None: the stack's retention


# the job-shape keys of the stack's TrainJob model (config/job_models.py JobBase) as trainctl's flags
FLAGS = {"numNodes": "--nodes", "instanceType": "--instance-type", "gpusPerNode": "--gpus-per-node", "image": "--image", "terminationGraceSeconds": "--grace-seconds"}


def job_shape_problems(req: Request) -> list[str]:
    """The request's job shape checked by the stack's own TrainJob model (``JobBase``): the same
    bounds, catalog, image and GPU rules as a stack job, each problem named by its flag."""
    raw = {"enabled": True, "numNodes": req.nodes, "instanceType": req.instance_type, "gpusPerNode": req.gpus_per_node, "image": req.image, "terminationGraceSeconds": req.grace_seconds}
    given = {k: v for k, v in raw.items() if v is not None}
    obj, problems = validate_section(JobBase, given, "")
    if obj is None and (repaired := repaired_section(JobBase, given)) is not None:
        # the model's own rules on the values that parsed (every problem at once, as the stack's loader)
        problems += [p for p in problems_of(repaired, "") if p.key not in {q.key for q in problems}]
    lines = []
    for p in problems:
        key = p.key.lstrip(".").split("[")[0]
        lines.append(f"{FLAGS.get(key, key)} {shown(p.value, key)}: {unshown_in(p.allowed, p.value, key)}")
    return lines


def ttl_flag(text: str | None) -> tuple[int | None, list[str]]:
    """``--ttl``'s seconds (a duration such as ``30m`` or ``1h30m``, or a whole number of seconds)
    and its problem line, if any."""
    if text is None:
        return None, []
    if text.isascii() and text.isdigit():
        return int(text), []
    if text != "Never" and _DURATION_RE.fullmatch(text):
        return retention_seconds(text), []
    return None, [f"--ttl {shown(text[:40])}: allowed: a duration such as 30m, 24h or 1h30m, or a whole number of seconds"]


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a TrainJob name at all (a local job's directory), or None; what
    ``--name`` may be: :func:`config.trainjob_names.name_problem`."""
    if _NAME_RE.fullmatch(name) and len(name) <= NAME_MAX:
        return None
    return f"allowed: a lowercase RFC 1035 label (a letter first, then letters, digits, '-'), at most {NAME_MAX} characters"


def check(req: Request) -> None:
    """Refuse bad input before anything is read or sent: one :class:`SubmitError` with a line per
    problem."""
    found = problems(req)
    if found:
        raise SubmitError("\n".join(found))


def problems(req: Request) -> list[str]:
    """Every problem of the request, one line each (no value that may be a secret is shown)."""
    problems = []
    if req.ttl_seconds is not None and req.ttl_seconds < 0:
        problems.append(f"--ttl {req.ttl_seconds}: allowed: 0 or more seconds")
    if req.runtime not in RUNTIMES:
        problems.append(f"unknown runtime {shown(req.runtime)}; allowed: {', '.join(RUNTIMES)}")
    if not DNS_LABEL_RE.fullmatch(req.namespace):
        problems.append(f"--namespace {shown(req.namespace)} is not a namespace name (a DNS label such as vision)")
    elif (what := system_namespaces().get(req.namespace)) is not None or req.namespace.startswith(RESERVED_NAMESPACE_PREFIX):
        # the namespaces the stack's config refuses for jobs (config/effect_rules.py): refused before the dry run prints a job there
        held = what or f"the {RESERVED_NAMESPACE_PREFIX} prefix is Kubernetes' own"
        problems.append(f"--namespace {req.namespace}: not a team's namespace ({held}); allowed: your team's namespace")
    problems += job_shape_problems(req)
    if req.name is not None and (why := trainjob_names.name_problem(req.name, max(req.nodes, 1))) is not None:
        problems.append(f"--name {shown(req.name)}: {why}")
    if req.resume_from is not None and (why := trainjob_names.name_problem(req.resume_from, 1)) is not None:  # any job that ran: 1 node at least
        problems.append(f"--resume-from {shown(req.resume_from)}: {why} (the name of the job whose checkpoints to start from)")
    elif req.resume_from is not None and req.resume_from == req.name:
        problems.append(f"--resume-from {shown(req.resume_from)}: the job's own name; a job resumes from its own checkpoints without it")
    if req.deps_timeout is not None and not DEPS_TIMEOUT_MIN <= req.deps_timeout <= DEPS_TIMEOUT_MAX:
        problems.append(f"--deps-timeout {req.deps_timeout}: allowed: {DEPS_TIMEOUT_MIN} to {DEPS_TIMEOUT_MAX} seconds")
    if req.trainer_version not in versions.TRAINER_VERSIONS:
        problems.append(f"--trainer-version {shown(req.trainer_version)}; allowed: {', '.join(versions.TRAINER_VERSIONS)}")
    if req.priority is not None and req.priority not in PRIORITIES:
        problems.append(f"--priority {shown(req.priority)}: allowed: {', '.join(PRIORITIES)}")
    elif req.priority is not None and req.trainer_version in KUEUE_INCOMPATIBLE_TRAINERS:
        # a priority is Kueue's (a WorkloadPriorityClass label), and no queue is written there
        problems.append(f"--priority: Trainer {req.trainer_version} jobs do not go through Kueue (it needs Trainer v2.2 or later), so a priority would do nothing; leave it out")
    if req.efa_zone is not None and not AZ_RE.fullmatch(req.efa_zone):
        problems.append(f"--efa-zone {shown(req.efa_zone)}: allowed: an AZ name such as us-west-2a")
    elif req.efa_zone is not None and (known := catalog.catalog()).get(req.instance_type) is not None and not known[req.instance_type].efa:
        efa_types = sorted(t for t, spec in known.items() if spec.efa)
        problems.append(f"--efa-zone: instance type {req.instance_type} has no EFA (the GPU catalog); pass --instance-type with one that has, such as {', '.join(efa_types[:4])} ({len(efa_types)} in all)")
    if not req.command:
        problems.append("no command: give it after --, e.g. trainctl submit ... ./proj -- python train.py")
    problems += secrets.command_problems(req.command)
    problems += env_problems(req)
    return problems


ENV_FLAGS = {"env": "--env", "secretEnv": "--secret-env"}


def env_flags(env: list[str] | None, secret_env: list[str] | None) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], list[str]]:
    """``--env NAME=VALUE`` and ``--secret-env NAME=SECRET/KEY`` (each repeatable) as the request's
    pairs, and a line per malformed or repeated one (no value shown)."""
    plain, lines = job_env.parse_assignments("--env", env or [])
    refs, more = job_env.parse_assignments("--secret-env", secret_env or [])
    return tuple(plain.items()), tuple(refs.items()), lines + more


def env_problems(req: Request) -> list[str]:
    """The job's --env and --secret-env by the stack's rules (config/job_env.py), a line per
    variable and problem, each naming the flag and the variable, never its value."""
    return job_env.lines(dict(req.env), dict(req.secret_env), ENV_FLAGS, local=req.local)


def runtime_for(req: Request, found: list[dict]) -> str:
    """The runtime a request with ``--grace-seconds`` runs on, from the cluster's runtimes of its
    kind (``found``; their labels: k8s/builders/runtimes.py): the live variant whose pods get that grace
    period (a TrainJob cannot carry one past Kueue), the newest if several; refused in one line
    naming the grace periods the platform offers for the runtime."""
    family = RUNTIMES[req.runtime]
    live = [r for r in found if (r["metadata"].get("labels") or {}).get(FAMILY_LABEL) == family and not r["metadata"].get("deletionTimestamp")]
    wanted = [r for r in live if r["metadata"]["labels"].get(GRACE_LABEL) == str(req.grace_seconds)]
    if not wanted:
        offered = sorted({int(g) for r in live if (g := r["metadata"]["labels"].get(GRACE_LABEL, "")).isdigit()})
        base = next((r["metadata"]["labels"][GRACE_LABEL] for r in live if r["metadata"]["labels"].get(RUNTIME_LABEL) == family), None)
        listed = ", ".join(f"{g}{' (the default)' if str(g) == base else ''}" for g in offered) or "none"
        raise SubmitError(f"--grace-seconds {req.grace_seconds}: this cluster's {family} runtimes offer {listed}; allowed: one of them (the platform adds others with trainer.graceClasses)")
    wanted.sort(key=lambda r: r["metadata"].get("creationTimestamp", ""))
    return wanted[-1]["metadata"]["name"]


def _resolve(arg: str, bundle: CodeBundle) -> str:
    rel = arg[2:] if arg.startswith("./") else arg
    return f"{tj.CODE_MOUNT}/{rel}" if rel in bundle.paths else arg


def with_facts(req: Request, facts: dict[str, Any] | None, *, instance_type_given: bool) -> Request:
    """The request as the cluster's published facts (``k8s/builders/platform_facts.py``) shape it: the default
    instance type is one its GPU pool launches, a type no pool launches is refused, and an EFA job
    lands in the EFA pool of its type with the platform's image (libfabric and aws-ofi-nccl; a stock
    image's NCCL silently falls back to TCP). Without facts (another cluster) it is unchanged."""
    if not facts:
        return req
    pools = facts.get("pools") or []
    changes: dict[str, Any] = {}
    deps = facts.get("dependencies") or {}  # the platform's package index (k8s/builders/platform_facts.py)
    if deps.get("indexUrl"):
        changes["pip_index_url"] = deps["indexUrl"]
    if deps.get("extraIndexUrls"):
        changes["pip_extra_index_urls"] = tuple(deps["extraIndexUrls"])
    if req.service_account is None and facts.get("serviceAccount"):  # the team's AWS identity rides on it (docs/teams-aws-access.md)
        changes["service_account"] = facts["serviceAccount"]
    if req.priority is None and facts.get("defaultPriority"):
        changes["priority"] = facts["defaultPriority"]
    if req.ttl_seconds is not None and "finishedJobRetentionMax" not in facts:  # a platform from before job TTLs: its cleanup would not read it
        raise SubmitError("--ttl: this platform does not delete jobs by their own TTL (its facts publish no finishedJobRetentionMax); leave --ttl out, its trainjobs.finishedJobRetention applies")
    if isinstance(facts.get("finishedJobRetentionMax"), str) and _DURATION_RE.fullmatch(facts["finishedJobRetentionMax"]):
        most = retention_seconds(facts["finishedJobRetentionMax"])
        if req.ttl_seconds is not None and most is not None and req.ttl_seconds > most:
            raise SubmitError(f"--ttl {req.ttl_seconds}s: allowed: at most {facts['finishedJobRetentionMax']} ({most}s, the platform's trainjobs.finishedJobRetentionMax)")
    if not instance_type_given and facts.get("defaultInstanceType"):
        changes["instance_type"] = facts["defaultInstanceType"]
    itype = changes.get("instance_type", req.instance_type)
    launching = [p for p in pools if itype in (p.get("instanceTypes") or []) and bool(p.get("efa")) == bool(req.efa_zone)]
    if not launching:
        where = "; ".join(f"{p['name']}{' (EFA)' if p.get('efa') else ''}: {', '.join(p.get('instanceTypes') or [])}" for p in pools)
        raise SubmitError(f"--instance-type {itype}: no {'EFA ' if req.efa_zone else ''}GPU pool of this cluster launches it; pools: {where}")
    if req.efa_zone:
        efa = facts.get("efa") or {}
        if efa.get("zone") and req.efa_zone != efa["zone"]:
            raise SubmitError(f"--efa-zone {req.efa_zone}: this cluster's EFA pool is in {efa['zone']}")
        changes["efa_types"] = tuple(efa.get("instanceTypes") or ())
        if req.image is None:
            if not facts.get("image"):
                raise SubmitError("--efa-zone: this cluster publishes no image with EFA's libraries; pass --image (one with libfabric and aws-ofi-nccl)")
            changes["image"] = facts["image"]
    return replace(req, **changes) if changes else req


def efa_image_warning(req: Request, facts: dict[str, Any] | None) -> str | None:
    """A warning (not a refusal) for an EFA job on an image that is not the platform's training
    image, the one known to carry EFA's software (workloads/Dockerfile installs libfabric and
    aws-ofi-nccl; docs/images.md): without them NCCL does not use EFA. ``req`` as
    :func:`with_facts` made it, ``facts`` the cluster's: a job still without an image (a dry run,
    or a cluster that publishes no facts) runs on its runtime's, the stock one."""
    if not req.efa_zone:
        return None
    if req.image is None:
        return ("--efa-zone: the job names no image (a dry run, or a cluster that publishes no platform facts), so it runs on its runtime's, "
                "the stock image without EFA's software (libfabric, aws-ofi-nccl): NCCL would fall back to TCP; a submit to a platform cluster gives it the platform's image, elsewhere pass --image with one that has them")
    known = (facts or {}).get("image")
    if known and req.image == known:
        return None
    platform = f"the platform's training image ({known})" if known else "the platform's training image (trainctl submit without --image uses it)"
    return (f"--image {REDACTED if looks_secret('image', req.image) else req.image} with --efa-zone: not {platform}, the one known to carry EFA's software (libfabric, aws-ofi-nccl); "
            "an image without them does not use EFA: NCCL falls back to TCP sockets, much slower")


SCRIPT_SUFFIXES = (".py", ".sh")


def entry(req: Request, bundle: CodeBundle) -> dict[str, Any]:
    """The TrainJob trainer's command/args and processes per node for the user's command. A script
    the command runs (``python train.py``, ``./run.sh``) must be in the code directory: the job
    would otherwise fail on every node after its GPUs were launched."""
    script = next((a for a in req.command[:2] if a.endswith(SCRIPT_SUFFIXES) and not a.startswith("-")), None)
    if script is not None and not script.startswith("/") and (script[2:] if script.startswith("./") else script) not in bundle.paths:
        raise SubmitError(f"the command runs {shown(script)}, which is not in the code dir {str(bundle.root)!r} (its files: {', '.join(sorted(bundle.paths)[:5])}{', ...' if len(bundle.paths) > 5 else ''})")
    command = [_resolve(a, bundle) for a in req.command]
    # one failure policy for all code: the platform's launcher runs the user's workers, so an exit
    # code 2 or 3 fails the job at once (the runtime's podFailurePolicy) instead of being retried
    launcher = f"{tj.CODE_MOUNT}/{LAUNCHER}"
    if req.runtime == "tensorflow":
        return {"args": ["python3", launcher, "python3", launcher, "--worker", *command], "numProcPerNode": 1}
    gpus = req.gpus_per_node if req.gpus_per_node is not None else catalog.lookup(req.instance_type).gpus
    if command[0] in ("python", "python3") and len(command) > 1 and (command[1] == "-m" or command[1].endswith(".py")):
        # torchrun as the Trainer's torch plugin expects it (PET_* from the env), each worker through the launcher
        command = ["torchrun", "--no-python", "python3", launcher, "--worker", "python3", "-u", *command[1:]]
        return {"command": ["python3", launcher, *command], "numProcPerNode": gpus}
    return {"command": ["python3", launcher, "python3", launcher, "--worker", *command], "numProcPerNode": gpus}


LAUNCHER = "_platform_launch.py"  # workloads/programs/launch.py, shipped beside the user's code
# workloads/programs/trainer_status.py, shipped beside the user's code: ``import _platform_status``
# and ``_platform_status.Reporter().update(step=..., total_steps=..., eta_s=...)`` puts the job's
# progress in its TrainJob (Trainer v2.3.0); elsewhere it does nothing
STATUS_MODULE = "_platform_status.py"
SHIPPED = {LAUNCHER: "launch.py", STATUS_MODULE: "trainer_status.py"}


def with_launcher(bundle: CodeBundle) -> CodeBundle:
    """The bundle plus the platform's launcher and progress reporter (refused if the user's
    directory has one of their names)."""
    # a file of that name, or a directory (its files would be mounted under the shipped file's path)
    taken = [name for name in SHIPPED if name in bundle.paths or name in bundle.files or any(rel.startswith(name + "/") for rel in bundle.paths)]
    if taken:
        kind = "file" if taken[0] in bundle.paths or taken[0] in bundle.files else "directory"
        raise SubmitError(f"the code dir has a {kind} named {shown(taken[0])}, the name of one of the platform's files beside your code ({', '.join(SHIPPED)}); rename it")
    shipped = {name: (tj.PROGRAMS_DIR / source).read_text() for name, source in SHIPPED.items()}
    return replace(bundle, files={**bundle.files, **shipped}, paths={**bundle.paths, **{name: name for name in shipped}})


def default_name(bundle: CodeBundle, num_nodes: int = 1) -> str:
    """The code directory's name as a TrainJob name (:func:`config.trainjob_names.label_from`: an
    RFC 1035 label: the name as it is when it is one, else what is left of it (``job`` when
    nothing is) with a hash of the whole name, so that ``My_Model`` and ``my-model`` stay apart), shortened with a hash of the whole when it is longer than a job of
    ``num_nodes`` nodes may be named (:func:`config.trainjob_names.name_max`).
    Not the code's hash: a fixed job keeps its name, so its checkpoint directory
    ``/mnt/checkpoints/<name>`` (:data:`tj.CHECKPOINT_DIR_ENV`) and resumes from it."""
    return trainjob_names.label_from(bundle.root.resolve().name, trainjob_names.name_max(max(num_nodes, 1)))


def dependencies(req: Request, bundle: CodeBundle) -> tj.Dependencies | None:
    """How the launcher installs the code directory's top-level requirements.txt (None without one)."""
    if tj.REQUIREMENTS_FILE not in bundle.paths:
        return None
    return tj.Dependencies(
        index_url=req.pip_index_url or tj.DEFAULT_PIP_INDEX_URL, extra_index_urls=tuple(req.pip_extra_index_urls),
        timeout_seconds=req.deps_timeout if req.deps_timeout is not None else tj.DEFAULT_DEPS_TIMEOUT_S,
    )


def checkpoint_env(name: str, resume_from: str | None) -> list[dict]:
    """Where the job's code writes and finds its checkpoints, and the other job's it starts from."""
    env = [{"name": tj.CHECKPOINT_DIR_ENV, "value": f"{tj.CHECKPOINT_MOUNT}/{name}"}]
    return env + ([{"name": tj.RESUME_FROM_ENV, "value": f"{tj.CHECKPOINT_MOUNT}/{resume_from}"}] if resume_from else [])


def platform_for(req: Request) -> JobPlatform:
    """The facts of the platform the job goes to, as trainctl knows them (the cluster's published
    facts, applied by :func:`with_facts`, and the flags): the Trainer version, the namespace, the
    runtime, the queue and, for a job in the EFA pool, that pool's types and zone. The builders take
    these (workloads/builders/job_platform.py); no stack config is read (a client has none)."""
    trainer = TrainerSettings(version=req.trainer_version)  # the platform's defaults: the runtime's name and grace period
    family = RUNTIMES[req.runtime]
    key = variant_key(family, req.grace_seconds, trainer)
    # the name the platform gives this runtime (its grace variant with --grace-seconds) with the default settings (k8s/builders/runtimes.py)
    name = req.runtime_name or BUILDERS[family](trainer, req.grace_seconds)["metadata"]["name"]
    return JobPlatform(
        trainer_version=req.trainer_version, namespace=req.namespace, runtime_names={key: name}, default_grace=trainer.termination_grace_seconds,
        efa_zone=req.efa_zone, efa_types=(tuple(req.efa_types) or (req.instance_type,)) if req.efa_zone else (),
        # Kueue cannot run jobs on Trainer v2.1.0 (config/settings.py KUEUE_INCOMPATIBLE_TRAINERS): no queue label there
        queue=req.queue if req.trainer_version not in KUEUE_INCOMPATIBLE_TRAINERS else None,
    )


def build(req: Request, bundle: CodeBundle) -> tuple[dict, dict]:
    """(ConfigMap, TrainJob) for a checked request."""
    check(req)
    bundle = with_launcher(bundle)
    platform = platform_for(req)
    name = req.name or default_name(bundle, req.nodes)
    if req.resume_from == name:
        raise SubmitError(f"--resume-from {name}: the job's own name (the code dir's); a job resumes from its own checkpoints without it")
    workload = tj.Workload(key=TRAINCTL_KIND, kind=TRAINCTL_KIND, name=name, program="", runtime=RUNTIMES[req.runtime], settings=JobBase, tiny_profile=())
    job = JobBase(enabled=True, num_nodes=req.nodes, instance_type=req.instance_type, gpus_per_node=req.gpus_per_node, image=req.image, termination_grace_seconds=req.grace_seconds,
                  env=dict(req.env), secret_env=dict(req.secret_env))
    configmap, trainjob = tj.run_objects(
        workload, job, platform, files=bundle.files, entry=entry(req, bundle), priority=req.priority, image=req.image if req.image is not None else tj.RUNTIME_IMAGE,
        deps=dependencies(req, bundle), env=checkpoint_env(name, req.resume_from), ttl_seconds=req.ttl_seconds,
    )
    items = bundle.items
    if req.service_account:  # the trainer pods only: the initializers run on the system nodes, as the namespace's default
        trainer_api.read_pod_customization(trainjob["spec"])["serviceAccountName"] = req.service_account
    if items:
        pod = trainer_api.read_pod_customization(trainjob["spec"])
        for volume in pod.get("volumes", []):
            if volume["name"] == tj.CODE_VOLUME:
                volume["configMap"]["items"] = items
    too_big = object_problems(bundle.root, len(bundle.paths), [configmap, trainjob], dict(req.env))  # what the API server can store
    if too_big:
        raise SubmitError("\n".join(too_big))
    return configmap, trainjob


def code_configmap_of(trainjob: dict) -> str | None:
    """The code ConfigMap a TrainJob mounts (either Trainer shape)."""
    pod = trainer_api.read_pod_customization(trainjob.get("spec", {}))
    for volume in pod.get("volumes", []):
        if volume.get("name") == tj.CODE_VOLUME and "configMap" in volume:
            return volume["configMap"].get("name")
    return None


def command_of(trainjob: dict, paths: set[str] | dict[str, str] | None) -> list[str] | None:
    """The user's command of a TrainJob :func:`entry` built, its inverse (Clone & edit): the
    launcher's prefix taken off, a shipped file's path under the code mount (``paths``: the code's
    relative paths; None when the code is unknown: any path there) given back as written relative;
    None for a TrainJob of another shape. ``python`` and ``python3`` build the same job on the torch
    runtime: ``python`` is given back."""
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    launcher = f"{tj.CODE_MOUNT}/{LAUNCHER}"
    torch = ["python3", launcher, "torchrun", "--no-python", "python3", launcher, "--worker", "python3", "-u"]
    plain = ["python3", launcher, "python3", launcher, "--worker"]
    given = [str(a) for a in (trainer.get("command") or trainer.get("args") or [])]
    if given[:len(torch)] == torch and len(given) > len(torch):
        command = ["python", *given[len(torch):]]
    elif given[:len(plain)] == plain and len(given) > len(plain):
        command = given[len(plain):]
    else:
        return None
    mount = tj.CODE_MOUNT + "/"
    return [a[len(mount):] if a.startswith(mount) and (paths is None or a[len(mount):] in paths) else a for a in command]


def code_files(configmap: dict, trainjob: dict) -> dict[str, str | bytes]:
    """The user's files of a code ConfigMap as :func:`build` made it (Clone & edit): relative path
    -> content (str: UTF-8 text, bytes: ``binaryData``), each key mounted back at its path (the
    volume's ``items``), the platform's own files beside them (:data:`SHIPPED`) left out."""
    import base64

    contents: dict[str, str | bytes] = dict((configmap.get("data") or {}).items())
    for key, value in (configmap.get("binaryData") or {}).items():
        contents[key] = value if isinstance(value, bytes) else base64.b64decode(value)
    pod = trainer_api.read_pod_customization(trainjob.get("spec", {}))
    items = next((v["configMap"].get("items") for v in pod.get("volumes", []) if v.get("name") == tj.CODE_VOLUME and "configMap" in v), None)
    where = {i["key"]: i["path"] for i in items or []}
    return {where.get(key, key): content for key, content in sorted(contents.items()) if where.get(key, key) not in SHIPPED}


def instance_type_of(trainjob: dict) -> str | None:
    """The instance type a TrainJob's nodes run on (its pods' node selector, as :func:`build` writes it)."""
    pod = trainer_api.read_pod_customization(trainjob.get("spec", {}))
    return (pod.get("nodeSelector") or {}).get("node.kubernetes.io/instance-type")
