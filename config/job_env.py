"""A job's own environment: plain variables (``env``) and variables read from a key of a Secret in
the job's namespace (``secretEnv``, a ``secretKeyRef``), for a stack's TrainJobs
(config/job_models.py ``JobBase``), ``trainctl submit --env/--secret-env`` and the portal. One set
of rules for all three, each problem one line that names the variable and never shows its value.

Rules:

* names: a letter or ``_``, then letters, digits and ``_`` (the names a POSIX shell can export:
  POSIX.1-2017 XBD 8.1 "Environment Variable Definition" and XCU 2.10.2 ``NAME``). Kubernetes takes
  more (k8s.io/apimachinery v0.34 ``pkg/util/validation`` ``IsEnvVarName``: ``[-._a-zA-Z][-._a-zA-Z0-9]*``;
  any printable ASCII but ``=`` with the RelaxedEnvironmentVariableValidation gate, as the Trainer's
  v2.3.0 CRD says), but a program started through ``bash`` or ``torchrun``'s shell never sees those;
* no name twice (a name in both ``env`` and ``secretEnv`` too);
* not a name the platform, the Trainer or torchrun sets (:data:`RESERVED_NAMES`,
  :data:`RESERVED_PREFIXES`): the Trainer's env entry replaces the runtime's of the same name
  (kubeflow/trainer v2.1.0 and v2.3.0 ``pkg/runtime/framework/plugins/jobset/builder.go``: ``UpsertEnvVars``
  of ``spec.trainer.env`` into container ``node``), so a job could silently undo what the platform
  relies on. The runtime's defaults ``NCCL_DEBUG`` (WARN) and ``PYTHONUNBUFFERED`` are a job's to
  change: :data:`OVERRIDABLE`;
* not a name the container's start depends on (:data:`START_NAMES`, :data:`START_PREFIXES`): the
  container runtime finds the command through ``PATH``, the dynamic loader reads ``LD_*`` and
  ``GLIBC_TUNABLES`` before any program runs (ld.so(8), ENVIRONMENT), the interpreter reads the
  ``PYTHON*`` names before the launcher (Python docs, "Command line and environment":
  ``PYTHONHOME``, ``PYTHONPATH``, ``PYTHONSTARTUP``, ...; the switches of :data:`PYTHON_SWITCHES`
  change no path and stay a job's), torchrun starts one worker per GPU the device plugin gave
  (``CUDA_VISIBLE_DEVICES``) and trainctl's local mode marks a job's processes (``TRAINCTL_*``).
  A job's entry replaces the image's, so ``PATH=/nonexistent`` is a container that never starts;
* a name shaped like a credential (a token pasted as the name, ``ghp_...=1``) is refused, never shown;
* a plain value that looks like a credential is refused, by its name (:func:`config.secrets.name_says_secret`:
  a word of the name such as ``PASS``, ``PASSWORD``, ``SECRET``, ``TOKEN``, ``KEY``, ``AUTH``, ``CREDENTIALS``,
  or a word ending in a long one, ``PGPASSWORD``, ``HFTOKEN``; the value itself credential-like by
  :func:`config.secrets.named_secret_value`: not a short plain word, a number, an absolute path or a
  tokenizer's token such as ``<pad>``)
  or by its shape (:func:`config.secrets.secret_shape`: known token prefixes, long hex strings,
  random-looking base64 strings, URLs with a password): a TrainJob's env is stored in plain text
  and anyone who can read the job sees it. Such a value goes into a Secret (``trainctl secret
  set``), and the job names it in ``secretEnv``;
* a Secret reference is ``<secret>/<key>``: the Secret's name a DNS subdomain (Kubernetes API
  conventions), the key by :func:`secret_key_problem` (``trainctl secret set``'s rule: ``-``,
  ``_``, ``.``, letters and digits, not ``.`` or ``..``: k8s.io/apimachinery v0.34
  ``IsConfigMapKey``, which Secret keys follow), each at most 253 characters;
* a run on this machine (``trainctl submit --local``, ``trainctl ui --local``) has no Secrets:
  ``secretEnv`` is refused there (``problems(..., local=True)``).

Every entry point (the stack's ``trainjobs`` and TrainJob stacks through ``JobBase.problems``,
trainctl's submit in both modes, the portal's API in both modes) calls :func:`problems`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from config.secrets import named_secret_value, secret_shape

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$", re.ASCII)
SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", re.ASCII)
SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$", re.ASCII)
NAME_MAX = 253

# torchrun sets these in every worker's environment (PyTorch v2.13.0
# torch/distributed/elastic/agent/server/local_elastic_agent.py ``_start_workers``); a job's value would be overwritten
# in the workers and mislead whatever reads it before them
_TORCHRUN = "torchrun sets it for each worker process"
_EFA = "the platform sets it for jobs that get EFA devices, and only for them (libfabric's EFA provider on a node without EFA fails NCCL's start)"
RESERVED_NAMES: dict[str, str] = {
    **{n: _TORCHRUN for n in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE")},
    # the tensorflow runtime's wrapper builds it from the Trainer's PET_* env (k8s/builders/runtimes.py)
    "TF_CONFIG": "the tensorflow runtime builds it from the node's rank and the job's nodes",
    # k8s/builders/runtimes.py EFA_ENV
    **{n: _EFA for n in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NCCL_NET_GDR_LEVEL")},
    "NODE_NAME": "the runtime sets it to the pod's node (the launcher's preflight names the node with it)",
    "HF_HUB_OFFLINE": "the platform sets it for jobs whose model and dataset its initializers downloaded",
    # the initializers' scratch paths (k8s/builders/runtimes.py) and the Trainer's initializer settings
    "STORAGE_URI": "the Trainer's initializers read it (spec.initializer)",
    "INITIALIZED_KEY": "the platform sets it (the initializers' download directory)",
    "TRAINJOB_NAME": "the platform sets it (the initializers' download directory)",
}
RESERVED_PREFIXES: dict[str, str] = {
    # kubeflow/trainer v2.3.0 pkg/constants/constants.go TorchRunReservedEnvNames (its webhook refuses those five);
    # torchrun takes every option's default from PET_<OPTION> (torch/distributed/run.py, env_var defaults)
    "PET_": "the Trainer sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, and torchrun reads every PET_<option> as that option",
    "MASTER_": _TORCHRUN + " (MASTER_ADDR, MASTER_PORT)",
    "TORCHELASTIC_": _TORCHRUN,
    "TRAINING_": "the platform's settings for its launcher and programs (TRAINING_JOB_NAME, TRAINING_STALL_TIMEOUT_S, TRAINING_PREFLIGHT, TRAINING_EXPECTED_GPUS, TRAINING_TERMINATION_GRACE_S, ...)",
    # k8s/builders/admission.py NVIDIA_ENV_PREFIX: the team admission policy refuses them too
    "NVIDIA_": "the NVIDIA container toolkit reads them (NVIDIA_VISIBLE_DEVICES=all would expose every GPU of the node); a team's job may not set them",
}
# What the container's start depends on (see the module's docstring)
_LOADER = "the dynamic loader reads it before any program of the container runs (ld.so(8), ENVIRONMENT): a wrong value stops python3, CUDA or NCCL from loading; put libraries into an image (--image)"
START_NAMES: dict[str, str] = {
    "PATH": "the container runtime finds the command (python3, the platform's launcher) through it and the launcher finds torchrun: a job's PATH replaces the image's and the job cannot start",
    "GLIBC_TUNABLES": _LOADER,
    "CUDA_VISIBLE_DEVICES": "the NVIDIA device plugin gives the container its GPUs and torchrun starts one worker per GPU (LOCAL_RANK picks it): hiding some fails the launcher's GPU check or the workers; allowed: --gpus-per-node",
}
START_PREFIXES: dict[str, str] = {
    "LD_": _LOADER + " (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...)",
    "PYTHON": "the Python interpreter reads it before the platform's launcher runs (PYTHONHOME, PYTHONPATH, PYTHONSTARTUP, ...: where Python and its modules are found; the launcher puts the code's requirements.txt first on PYTHONPATH)",
    "TRAINCTL_": "trainctl's local mode marks every process of a job with TRAINCTL_LOCAL_JOB (how trainctl delete --local finds them)",
}
PYTHON_SWITCHES = ("PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONTRACEMALLOC", "PYTHONDEVMODE",
                   "PYTHONOPTIMIZE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE")
"""The interpreter's switches that change no path (Python docs, "Environment variables"): a job's to set."""
OVERRIDABLE = ("NCCL_DEBUG", "PYTHONUNBUFFERED")
"""Runtime env a job may change (k8s/builders/runtimes.py BASE_ENV): a job's entry replaces the runtime's."""

SECRET_HINT = "keep the value in a Secret (trainctl secret set NAME KEY=@FILE) and pass it as a Secret reference (trainctl submit --secret-env VAR=SECRET/KEY; a stack job's secretEnv)"


def reserved_why(name: str) -> str | None:
    """Why ``name`` is not a job's to set (the platform, the Trainer or torchrun sets it), or None."""
    if name in RESERVED_NAMES:
        return RESERVED_NAMES[name]
    return next((why for prefix, why in RESERVED_PREFIXES.items() if name.startswith(prefix)), None)


def start_why(name: str) -> str | None:
    """Why ``name`` is one the container's start depends on (the runtime, the loader, Python,
    torchrun, trainctl's local mode), or None."""
    if name in START_NAMES:
        return START_NAMES[name]
    if name in PYTHON_SWITCHES:
        return None
    why = next((why for prefix, why in START_PREFIXES.items() if name.startswith(prefix)), None)
    if why is not None and name.startswith("PYTHON"):
        why += f"; allowed: the switches {', '.join(PYTHON_SWITCHES)}"
    return why


def name_problem(name: str) -> str | None:
    """Why ``name`` may not be a job's variable, or None (never holding the name)."""
    if secret_shape(name) is not None:  # a token pasted as the name (--env ghp_...=1) would be rendered into the job
        return "the name has the shape of a credential (a token pasted as the name?); a TrainJob's env is stored in plain text; allowed: a variable name, its value in a Secret (" + SECRET_HINT + ")"
    if not ENV_NAME_RE.fullmatch(name) or len(name) > NAME_MAX:
        return f"not a variable name; allowed: a letter or _, then letters, digits and _ (at most {NAME_MAX} characters)"
    why = reserved_why(name)
    if why:
        return f"set by the platform: {why}; allowed: another name"
    why = start_why(name)
    return f"the job's start depends on it: {why}; allowed: another name" if why else None


def value_problem(name: str, value: str) -> str | None:
    """Why the plain value of ``name`` looks like a credential (by the name or by its shape), or
    None; the line never holds the value."""
    shape = secret_shape(value, name)
    if shape is None and not named_secret_value(name, value):
        return None
    why = shape or "the name says it is a credential (a password, secret, token or key)"
    return f"the value looks like a secret: {why}; a TrainJob's env is stored in plain text, readable by anyone who can read the job; {SECRET_HINT}"


def secret_ref(text: str) -> tuple[str, str] | None:
    """``<secret>/<key>`` as (secret, key), or None when it is not one."""
    secret, sep, key = text.partition("/")
    if not sep or not SECRET_NAME_RE.fullmatch(secret) or len(secret) > NAME_MAX or secret_key_problem(key) is not None:
        return None
    return secret, key


SECRET_REF_ALLOWED = "allowed: SECRET/KEY, a Secret of the job's namespace (a DNS subdomain such as wandb) and one of its keys (letters, digits, '-', '_', '.', not . or ..), such as wandb/api-key"
LOCAL_SECRET_ENV = (
    "a run on this machine reads no cluster Secrets; it inherits the environment of the shell that runs trainctl: "
    "export the variable there (or leave it out); nothing was started"
)


def secret_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Secret's data key, or None."""
    if SECRET_KEY_RE.fullmatch(key) and len(key) <= NAME_MAX and key not in (".", ".."):
        return None
    return f"allowed: letters, digits, '-', '_' and '.', not . or .. (at most {NAME_MAX} characters)"


def problems(env: Mapping[str, str], secret_env: Mapping[str, str], *, local: bool = False) -> list[tuple[str, str, str]]:
    """(``env`` or ``secretEnv``, variable name, problem) for every problem of a job's env; no
    value is shown. ``local``: a run on this machine, which has no Secrets (one line, name ``""``,
    first)."""
    found: list[tuple[str, str, str]] = [("secretEnv", "", LOCAL_SECRET_ENV)] if local and secret_env else []
    for which, items in (("env", env), ("secretEnv", secret_env)):
        for name, value in items.items():
            why = name_problem(name)
            if why is not None:
                found.append((which, name, why))
            if secret_shape(name) is not None:  # a value given as the name (a token pasted without NAME=): never shown
                found = [(w, shown_name(n), y) for w, n, y in found]
            if which == "env" and isinstance(value, str) and (why := value_problem(name, value)) is not None:
                found.append((which, name, why))
            if which == "secretEnv" and secret_ref(value) is None:
                found.append((which, name, f"not a Secret reference; {SECRET_REF_ALLOWED}"))
    for name in sorted(set(env) & set(secret_env)):
        found.append(("secretEnv", name, "also in env: a variable has one value; allowed: the name in env or secretEnv, not both"))
    return found


def lines(env: Mapping[str, str], secret_env: Mapping[str, str], labels: Mapping[str, str], *, local: bool = False) -> list[str]:
    """:func:`problems` as lines, each ``<label> <name>: <problem>`` with ``labels`` naming ``env``
    and ``secretEnv`` as the entry point does (``--env``, ``trainjobs.ddp.env``, ...)."""
    return [f"{labels[which]}{f' {name}' if name else ''}: {why}" for which, name, why in problems(env, secret_env, local=local)]


def shown_name(name: str) -> str:
    """``name`` as a problem line may show it: not when it has the shape of a credential."""
    return "(a name shaped like a secret, not shown)" if secret_shape(name) is not None else name


def parse_assignments(flag: str, items: Iterable[str], *, what: str = "argument") -> tuple[dict[str, str], list[str]]:
    """``NAME=VALUE`` arguments of ``flag`` (repeatable) as a dict, and a line per problem (a
    missing ``=``, a name given twice); values never appear in a line. ``what``: how a problem
    line names an item without a name (trainctl's arguments, the portal form's entries)."""
    out: dict[str, str] = {}
    lines: list[str] = []
    for i, item in enumerate(items):
        name, sep, value = item.partition("=")
        if not sep or not name:
            shown = name if sep and name else f"{what} {i + 1}"  # an argument without '=' may be a value: not shown
            lines.append(f"{flag} {shown}: allowed: NAME={'SECRET/KEY' if 'secret' in flag else 'VALUE'}")
            continue
        if name in out:
            lines.append(f"{flag} {shown_name(name)}: given twice; allowed: each variable once")
            continue
        out[name] = value
    return out, lines


def env_list(env: Mapping[str, str], secret_env: Mapping[str, str]) -> list[dict]:
    """The container env entries: plain values, then Secret references (``secretKeyRef``), each in name order."""
    entries: list[dict] = [{"name": n, "value": env[n]} for n in sorted(env)]
    for name in sorted(secret_env):
        ref = secret_ref(secret_env[name])
        if ref is None:  # refused by :func:`problems` before anything is built
            raise ValueError(f"secretEnv {name}: not a Secret reference")
        entries.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref[0], "key": ref[1]}}})
    return entries
