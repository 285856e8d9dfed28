"""A submission as the portal takes it (the seed guide's request, the form's, the upload's) and
judges it: :class:`JobSpec`, every problem at once as :class:`Problems` (one ``{"field",
"problem"}`` each), and :func:`request_of`, the trainctl request it becomes (trainctl/objects.py).

The seed guide's resources per worker (``gpu_per_node``, ``cpu_per_node``, ``memory_per_node``,
Kubernetes quantities or numbers) become the platform's job shape: the smallest GPU instance type
of the cluster's GPU pools (its published facts; the GPU catalog without them) whose training
pod, sized by the catalog (``config/catalog.py node_pod_request``), gets at least those CPUs and
GiB with that many GPUs. A request with ``user_id`` and no name gets the guide's
``<user_id>-job-<timestamp>`` (:func:`guide_name`)."""

from __future__ import annotations

import math
import pathlib
import re
import shlex
import tempfile
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from config import catalog, trainjob_names
from config.secrets import shown
from trainctl import objects
from trainctl.code import CodeError, collect
from trainctl.portal.upload import Part, UploadError, unpack

FRAMEWORKS = {"pytorch": "torch", "torch": "torch", "tensorflow": "tensorflow"}
"""The seed guide's ``framework`` -> trainctl's runtime. MPI has no runtime here: the platform's
runtimes (k8s/builders/runtimes.py) start every program with torchrun or TF_CONFIG, DeepSpeed's
too; the form shows the choice disabled with :data:`MPI_REASON` (trainctl/portal/form.py)."""
MPI_REASON = "this platform has no MPI runtime (its runtimes start programs with torchrun, for PyTorch and DeepSpeed, or with TF_CONFIG, for TensorFlow; not with an MPI launcher such as mpirun or horovodrun)"
# trainctl's flags -> the request fields the portal names in its problems
FIELDS = {"--nodes": "config.num_nodes", "--gpus-per-node": "config.gpu_per_node", "--instance-type": "config.instance_type", "--image": "image", "--name": "name",
          "--namespace": "namespace", "--env": "env", "--secret-env": "secret_env", "--grace-seconds": "config.grace_seconds", "--priority": "priority",
          "--ttl": "ttl_seconds_after_finished", "--deps-timeout": "deps_timeout"}


class Problems(ValueError):
    """Bad input: ``problems`` is a list of ``{"field", "problem"}``; nothing was created.
    ``status``: the HTTP status of the answer (422; 409 for a name taken)."""

    def __init__(self, problems: list[dict[str, str]], status: int = 422):
        super().__init__("; ".join(f"{p['field']}: {p['problem']}" for p in problems))
        self.problems = problems
        self.status = status


def _problem(field: str, text: str) -> dict[str, str]:
    return {"field": field, "problem": text}


def _from_trainctl(lines: list[str]) -> list[dict[str, str]]:
    """trainctl's problem lines (each names its flag first) as the portal's fields."""
    out = []
    for line in lines:
        flag = line.split(" ", 1)[0].rstrip(":")
        field = FIELDS.get(flag, "request")
        out.append(_problem(field, line[len(flag):].lstrip(" :") if flag in FIELDS else line))
    return out


@dataclass(frozen=True)
class JobSpec:
    """A submission as the portal takes it (the seed guide's request, plus the form's extras)."""

    namespace: str
    framework: str
    num_nodes: Any
    gpu_per_node: Any
    cpu_per_node: Any = None
    memory_per_node: Any = None
    command: str = "python train.py"
    name: str | None = None
    image: str | None = None
    instance_type: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the job's variables (config/job_env.py rules, as trainctl's --env)
    secret_env: tuple[tuple[str, str], ...] = ()  # NAME, SECRET/KEY (--secret-env)
    ttl_seconds: Any = None  # delete the job this long after it finishes (--ttl); None: the platform's retention
    priority: Any = None  # Kueue priority (--priority: low, normal, high); None: the team's default
    grace_seconds: Any = None  # SIGTERM to SIGKILL, a runtime variant's (--grace-seconds); None: the runtime's
    deps_timeout: Any = None  # seconds for installing requirements.txt (--deps-timeout); None: the platform's default
    replace_finished: bool = True  # a finished job of the name is replaced (a resubmit); False for a name made for the request


def _int(field: str, value: Any, problems: list, *, lo: int, hi: int, required: bool = True) -> int | None:
    if value is None or value == "":
        if required:
            problems.append(_problem(field, "required"))
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        problems.append(_problem(field, "allowed: a whole number"))
        return None
    if isinstance(value, str) and not value.strip().isascii():  # int() takes other scripts' digits too
        problems.append(_problem(field, "allowed: a whole number"))
        return None
    try:
        n = int(value)
    except ValueError:
        problems.append(_problem(field, "allowed: a whole number"))
        return None
    if not lo <= n <= hi:
        problems.append(_problem(field, f"{n}: allowed: {lo} to {hi}"))
        return None
    return n


# a Kubernetes quantity (apimachinery resource.Quantity: a signed decimal, then a binary or decimal
# suffix or an exponent); the sign is left out: no resource here may be negative
_QUANTITY_RE = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?\d{1,3})?$", re.ASCII)


def _quantity(field: str, value: Any, problems: list, *, unit: int, lo: int, hi: int) -> int | None:
    """A whole number of ``unit`` (rounded up) from a number in those units or a Kubernetes quantity
    string (the seed guide sends ``"memory_per_node": "16Gi"``; ``"4"``, ``"500m"``, ``"16G"`` too):
    ``unit`` is 1 for CPUs and 2**30 for GiB of memory. A bare number (``16``, ``"16"``) is in units,
    as the form's fields are."""
    if isinstance(value, str) and value.strip() and not (value.strip().isascii() and value.strip().isdigit()):
        from decimal import Decimal

        from kubernetes.utils import parse_quantity

        what = f"a whole number{' of GiB' if unit > 1 else ''} or a Kubernetes quantity ({'16Gi, 64G' if unit > 1 else '4, 500m'})"
        text = value.strip()
        if len(text) > 40 or not _QUANTITY_RE.fullmatch(text):  # Kubernetes' own form (no NaN, Infinity, 1_6 that Decimal takes)
            problems.append(_problem(field, f"{shown(value[:40])}: allowed: {what}"))
            return None
        try:
            plain = _QUANTITY_RE.fullmatch(text).group(3) is None  # type: ignore[union-attr]  (matched above)
            amount = Decimal(text) * unit if plain else parse_quantity(text)  # a bare number is in units, as the form's fields
        except (ValueError, ArithmeticError):
            problems.append(_problem(field, f"{shown(value[:40])}: allowed: {what}"))
            return None
        # compared as Decimals first: 1e999999 is a short string and a huge integer
        if not amount.is_finite() or not Decimal((lo - 1) * unit) < amount <= Decimal(hi * unit):
            problems.append(_problem(field, f"{shown(value[:40])}: allowed: {lo} to {hi}{' GiB' if unit > 1 else ''}"))
            return None
        return int(math.ceil(amount / unit))
    return _int(field, value, problems, lo=lo, hi=hi, required=False)


def guide_name(user_id: str, num_nodes: Any, when: datetime) -> str:
    """The seed guide's TrainJob name, ``<user_id>-job-<YYYYMMDDHHMMSS>`` (UTC), for a request that
    gives ``user_id`` and no name. A user id that is not a label is made one as a code directory's
    name is (config/trainjob_names.py ``label_from``: ``alice@example.com`` ->
    ``alice-example-com-<hash8>``, apart from ``alice-example-com``), cut so that the name and its
    pods' names fit."""
    stamp = when.astimezone(UTC).strftime("%Y%m%d%H%M%S")
    nodes = num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) and 1 <= num_nodes <= 1000 else 1
    suffix = f"-job-{stamp}"
    return trainjob_names.label_from(user_id, trainjob_names.name_max(nodes) - len(suffix), default="user") + suffix


def pick_instance_type(gpus: int, cpus: int | None, memory_gib: int | None, types: list[str]) -> str | None:
    """The smallest of ``types`` whose training pod of ``gpus`` GPUs gets at least ``cpus`` and
    ``memory_gib`` (the catalog's sizing), or None."""
    fits = []
    for t in types:
        info = catalog.catalog().get(t)
        if info is None or info.gpus < gpus:
            continue
        cpu, mem = catalog.node_pod_request(info, gpus)
        if (cpus is None or cpu >= cpus) and (memory_gib is None or mem >= memory_gib):
            fits.append((info.gpus, info.vcpu, info.memory_gib, t))
    return min(fits)[3] if fits else None


def pool_types(facts: dict | None) -> list[str]:
    """The instance types the cluster's GPU pools (not the EFA pools) launch; the catalog without facts."""
    if facts and facts.get("pools"):
        return sorted({t for p in facts["pools"] if not p.get("efa") for t in p.get("instanceTypes") or []})
    return sorted(catalog.catalog())


def request_of(spec: JobSpec, facts: dict | None, *, local: bool = False) -> objects.Request:
    """The trainctl request of a submission, every problem at once (:class:`Problems`); ``local``:
    a run on this machine (``trainctl ui --local``), judged as ``trainctl submit --local``."""
    problems: list[dict[str, str]] = []
    runtime = FRAMEWORKS.get(str(spec.framework).lower())
    if runtime is None:
        extra = f" (MPI: {MPI_REASON})" if str(spec.framework).lower() == "mpi" else ""
        problems.append(_problem("framework", f"{shown(str(spec.framework)[:40])}: allowed: pytorch, tensorflow{extra}"))
    nodes = _int("config.num_nodes", spec.num_nodes, problems, lo=1, hi=1000)
    gpus = _int("config.gpu_per_node", spec.gpu_per_node, problems, lo=1, hi=max(i.gpus for i in catalog.catalog().values()))
    cpus = _quantity("config.cpu_per_node", spec.cpu_per_node, problems, unit=1, lo=1, hi=max(i.vcpu for i in catalog.catalog().values()))
    memory = _quantity("config.memory_per_node", spec.memory_per_node, problems, unit=2**30, lo=1, hi=max(i.memory_gib for i in catalog.catalog().values()))
    ttl = _int("ttl_seconds_after_finished", spec.ttl_seconds, problems, lo=0, hi=10**9, required=False)
    # parsed here, judged by trainctl's rules below (objects.problems: the stack's bounds, the priorities)
    grace = _int("config.grace_seconds", spec.grace_seconds, problems, lo=-(10**9), hi=10**9, required=False)
    deps_timeout = _int("deps_timeout", spec.deps_timeout, problems, lo=-(10**9), hi=10**9, required=False)
    priority = spec.priority or None
    if priority is not None and not isinstance(priority, str):
        problems.append(_problem("priority", "allowed: a priority's name"))
        priority = None
    if ttl is not None and local:
        problems.append(_problem("ttl_seconds_after_finished", "not in local mode (a local job stays until it is deleted)"))
    try:
        command = shlex.split(spec.command or "")
    except ValueError as err:
        problems.append(_problem("command", f"not a command line ({err})"))
        command = []
    itype = spec.instance_type or objects.DEFAULT_INSTANCE_TYPE
    given = catalog.catalog().get(spec.instance_type or "")
    if given is not None and gpus is not None and given.gpus >= gpus and (cpus is not None or memory is not None):  # a type named beside the resources it must give
        cpu, mem = catalog.node_pod_request(given, gpus)
        if (cpus is not None and cpu < cpus) or (memory is not None and mem < memory):
            problems.append(_problem("config.instance_type", f"{spec.instance_type}: a worker of {gpus} GPUs gets {cpu} CPUs and {mem} GiB there, less than the {cpus or 'any'} CPUs and "
                                                             f"{memory or 'any'} GiB asked; allowed: a larger type, or none (the smallest type of the cluster that gives them)"))
    if spec.instance_type is None and gpus is not None:
        types = pool_types(facts)
        found = pick_instance_type(gpus, cpus, memory, types)
        if found is None:
            problems.append(_problem("config", f"no GPU instance type of this cluster gives a worker {gpus} GPUs, {cpus or 'any'} CPUs and {memory or 'any'} GiB (its types: {', '.join(types[:8])}{', ...' if len(types) > 8 else ''})"))
        else:
            itype = found
    req = objects.Request(namespace=str(spec.namespace), nodes=nodes or 1, command=command, runtime=runtime or "torch", gpus_per_node=gpus, instance_type=itype, image=spec.image or None, name=spec.name or None,
                              env=tuple(spec.env), secret_env=tuple(spec.secret_env), local=local, ttl_seconds=ttl,
                              priority=priority, grace_seconds=grace, deps_timeout=deps_timeout)
    problems += [p for p in _from_trainctl(objects.problems(req)) if not any(q["field"] == p["field"] for q in problems)]
    if problems:
        raise Problems(problems)
    return req


def code_bundle(files: list[Part], name: str | None):
    """The upload as trainctl's code bundle (trainctl/code.py ``collect`` with its limits), named
    after the job, not the temporary directory it was unpacked in; :class:`Problems` when refused."""
    with tempfile.TemporaryDirectory(prefix="portal-upload-") as tmp:
        root = pathlib.Path(tmp) / (name or "code")
        root.mkdir()
        try:
            unpack(files, root)
            bundle = collect(root)
        except (UploadError, CodeError) as err:
            raise Problems([_problem("training_code", line.replace(str(root), "the upload")) for line in str(err).splitlines()]) from None
    return replace(bundle, root=pathlib.Path(name or "job"))
