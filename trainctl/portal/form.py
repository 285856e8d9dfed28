"""The submit form's logic (trainctl/portal/pages.py keeps the routes thin): the choices it offers,
a job's form for Clone & edit, a posted form as a submission, and its problems tied to its fields.

Clone & edit carries everything of the job: its framework (the runtime), nodes, GPUs, CPUs and
memory per node with the instance type, image, its Kueue priority, TTL, requirements install time
limit and grace period (:func:`options_of`), command and arguments (the inverse of trainctl's
entry: :func:`trainctl.objects.command_of`), every file of its code (:func:`trainctl.objects.code_files`:
``train.py`` and ``requirements.txt`` in their boxes, every other file carried in the form as it
is), its variables and Secret references. A Secret's value is never read (a team cannot read its
Secrets back): the clone names the same Secret and key, and the form says so; whatever else is not
carried is said on the form too (:func:`clone_form` ``notes``).

A browser sends a text box with CRLF line ends (HTML's form submission); the code and requirements
boxes are read with LF, so a clone resubmitted unchanged ships the same bytes, hence the same
ConfigMap. A file with a CR of its own is carried, never put in a box. Carried files travel in one
hidden field as JSON (every control character escaped, so no line end is rewritten).

The env and Secret reference boxes hold one ``NAME=VALUE`` (``NAME=SECRET/KEY``) per line, parsed
and judged as trainctl's ``--env``/``--secret-env`` (config/job_env.py: the same rules and lines).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from config import job_env
from config.settings import TF_RUNTIME, TORCH_RUNTIME
from k8s.builders.kueue import PRIORITY_LABEL
from k8s.builders.tenants import TTL_ANNOTATION
from trainctl import objects
from trainctl.code import requirements_problems
from trainctl.portal.submission import FRAMEWORKS, MPI_REASON, JobSpec, Problems, _from_trainctl, pick_instance_type, pool_types, request_of
from trainctl.portal.upload import Part
from workloads.builders.trainjobs import DEFAULT_DEPS_TIMEOUT_S, REQUIREMENTS_FILE, RESUME_FROM_ENV

TRAIN_PY = "train.py"
# the mockup's size presets: GPUs, CPUs and GB of memory per worker
PRESETS: dict[str, dict[str, Any]] = {
    "small": {"title": "Small", "gpus": 1, "cpus": 4, "memory": 16},
    "medium": {"title": "Medium", "gpus": 2, "cpus": 8, "memory": 32},
    "large": {"title": "Large", "gpus": 4, "cpus": 16, "memory": 64},
    "custom": {"title": "Custom"},
}
EXAMPLE = "import os\nprint('hello from worker', os.environ.get('PET_NODE_RANK', os.environ.get('TF_CONFIG', '?')))\n"
FRAMEWORK_LABELS = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}
# a problem's field -> the id of the control it is about (its message is tied to it with aria-describedby) and the control's label
CONTROLS: dict[str, tuple[str, str]] = {
    "framework": ("framework-pytorch", "Framework"), "config.num_nodes": ("num_nodes", "Number of nodes"), "config.gpu_per_node": ("gpu_per_node", "GPUs per node"),
    "config.cpu_per_node": ("cpu_per_node", "CPUs per node"), "config.memory_per_node": ("memory_per_node", "Memory per node"), "config": ("gpu_per_node", "Resources per worker"),
    "config.instance_type": ("instance_type", "Instance type"), "image": ("image", "Custom image"), "name": ("name", "Job name"), "command": ("command", "Command"),
    "request": ("command", "Command"), "training_code": ("training_code", "train.py"), "requirements": ("requirements", "requirements.txt"), "files": ("files", "Files"),
    "carried": ("keep_carried", "Carried files"), "env": ("env", "Environment variables"), "secret_env": ("secret_env", "Secret references"),
    "priority": ("priority", "Priority"), "ttl_seconds_after_finished": ("ttl", "Delete after it finishes"), "config.grace_seconds": ("grace_seconds", "Grace period"),
    "deps_timeout": ("deps_timeout", "Requirements install time limit"),
}
DEPS_TIMEOUT_ENV = "TRAINING_DEPS_TIMEOUT_S"  # the launcher's (workloads/builders/trainjobs.py Dependencies)


@dataclass(frozen=True)
class Choice:
    value: str
    label: str
    reason: str | None = None  # why the platform cannot run it (shown, the choice disabled); None: offered


def framework_choices() -> list[Choice]:
    """The frameworks the platform's runtimes run (those trainctl submits to: trainctl/objects.py
    RUNTIMES), and MPI, disabled with the reason."""
    offered = [Choice(value, label) for value, label in FRAMEWORK_LABELS.items() if FRAMEWORKS.get(value) in objects.RUNTIMES]
    return [*offered, Choice("mpi", "MPI (Horovod, mpirun)", MPI_REASON)]


def preset_choices(facts: dict | None, *, local: bool) -> list[Choice]:
    """The size presets, each disabled with the reason when no GPU pool of the cluster (its
    published facts: :func:`~trainctl.portal.submission.pool_types`) gives a worker its GPUs, CPUs
    and memory; on this machine (``local``) or without facts, every one is offered."""
    out = []
    for key, p in PRESETS.items():
        reason = None
        if "gpus" in p and not local and facts and facts.get("pools"):
            types = pool_types(facts)
            if pick_instance_type(p["gpus"], p["cpus"], p["memory"], types) is None:
                reason = (f"no GPU pool of this cluster gives a worker {p['gpus']} GPU{'s' if p['gpus'] != 1 else ''}, {p['cpus']} CPUs and {p['memory']} GiB "
                          f"(its types: {', '.join(types) or 'none'})")
        out.append(Choice(key, p["title"] + (f" ({p['gpus']} GPU, {p['cpus']} CPU, {p['memory']} GB)" if "gpus" in p else ""), reason))
    return out


def priority_choices(facts: dict | None, *, local: bool) -> list[str] | None:
    """The Kueue priorities the form offers (trainctl's ``--priority``): the platform's when its
    facts say Kueue is on, trainctl's own without facts; None where no queue orders jobs (on this
    machine, or Kueue off): a clone's priority is then carried in a hidden field."""
    if local or (facts is not None and not facts.get("kueue")):
        return None
    return [p for p in (facts or {}).get("priorities") or objects.PRIORITIES if p in objects.PRIORITIES]


def with_offered(form: dict[str, Any], presets: list[Choice]) -> dict[str, Any]:
    """A new job's form on the first preset the cluster runs (Custom when it runs none)."""
    if any(c.value == form.get("preset") and c.reason for c in presets):
        return {**form, "preset": next((c.value for c in presets if not c.reason), "custom")}
    return form


def blank() -> dict[str, Any]:
    """A new job's form."""
    return {"framework": "pytorch", "num_nodes": 1, "preset": "small", "gpu_per_node": "", "cpu_per_node": "", "memory_per_node": "", "instance_type": "", "image": "", "name": "",
            "command": "python train.py", "code_source": "paste", "training_code": EXAMPLE, "requirements": "", "carried": "", "keep_carried": "1", "env": "", "secret_env": "", "notes": [],
            "image_choice": "builtin", "priority": "", "ttl": "", "grace_seconds": "", "deps_timeout": ""}


def _whole(quantity: Any) -> int | str:
    """A CPU request as the form's whole number ("5" -> 5), else "" (left for the user)."""
    text = str(quantity or "")
    return int(text) if text.isdigit() else ""


def _gib(quantity: Any) -> int | str:
    text = str(quantity or "")
    return int(text[:-2]) if text.endswith("Gi") and text[:-2].isdigit() else ""


def encode_carried(files: Mapping[str, str | bytes]) -> str:
    """Files as the hidden field's JSON: ``[[path, "text" | "base64", content], ...]``."""
    return json.dumps([[rel, "text", c] if isinstance(c, str) else [rel, "base64", base64.b64encode(c).decode()] for rel, c in sorted(files.items())]) if files else ""


def decode_carried(text: str) -> tuple[dict[str, bytes], list[dict[str, str]]]:
    """The hidden field's files (path -> bytes), or a problem when it is not what :func:`encode_carried` writes."""
    if not text:
        return {}, []
    bad = [{"field": "carried", "problem": "the carried files are damaged (edited by hand?): reload the Clone & edit page, or paste or upload the code"}]
    try:
        entries = json.loads(text)
    except ValueError:
        return {}, bad
    out: dict[str, bytes] = {}
    if not isinstance(entries, list):
        return {}, bad
    for e in entries:
        if not (isinstance(e, list) and len(e) == 3 and all(isinstance(x, str) for x in e) and e[1] in ("text", "base64")):
            return {}, bad
        try:
            out[e[0]] = e[2].encode("utf-8") if e[1] == "text" else base64.b64decode(e[2], validate=True)
        except (binascii.Error, UnicodeEncodeError):
            return {}, bad
    return out, []


def carried_list(text: str) -> list[tuple[str, int]]:
    """(path, bytes) of the carried files, for the page."""
    files, _ = decode_carried(text)
    return sorted((rel, len(data)) for rel, data in files.items())


def _user_env(entries: list[dict], notes: list[str]) -> tuple[str, str]:
    """The job's own variables and Secret references as the form's boxes (the platform's own
    entries, names a job may not set, left out); what a box cannot hold goes to ``notes``."""
    plain, refs = [], []
    for e in entries or []:
        name = str(e.get("name", ""))
        if name == RESUME_FROM_ENV:
            notes.append(f"Resuming from another job's checkpoints ({str(e.get('value', '')).rsplit('/', 1)[-1]}) is not carried: the portal has no such field (trainctl submit --resume-from).")
            continue
        if job_env.name_problem(name) is not None:  # the platform's (TRAINING_*, ...): not the job's to set
            continue
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if "value" in e and "\n" not in str(e["value"]) and "\r" not in str(e["value"]):
            plain.append(f"{name}={e['value']}")
        elif isinstance(ref, dict) and ref.get("name") and ref.get("key"):
            refs.append(f"{name}={ref['name']}/{ref['key']}")
        else:
            notes.append(f"Variable {name} is not carried: {'its value has a line break, which a line of the box cannot hold' if 'value' in e else 'it is read from another source than a Secret'}; add it again.")
    if refs:
        notes.append("Secret references are carried, the Secrets' values are not (nobody can read them back): the clone reads the same Secret keys of your namespace when it starts, "
                     "whatever they hold then.")
    return "\n".join(plain), "\n".join(refs)


def options_of(tj: dict[str, Any]) -> dict[str, str]:
    """The job's options trainctl's flags set (the inverse of objects.build's): its Kueue priority
    (the label), TTL (the annotation), requirements install time limit (the launcher's variable;
    empty: the default) and grace period (its runtime variant's name, ``<runtime>-grace<N>-<hash>``;
    empty: the runtime's own)."""
    meta = tj.get("metadata") or {}
    trainer = (tj.get("spec") or {}).get("trainer") or {}
    runtime = str(((tj.get("spec") or {}).get("runtimeRef") or {}).get("name", ""))
    family = TF_RUNTIME if runtime.startswith(TF_RUNTIME) else TORCH_RUNTIME
    grace = re.fullmatch(rf"{re.escape(family)}-grace(\d+)(-[0-9a-z]+)?", runtime, re.ASCII)
    deps = next((str(e.get("value", "")) for e in trainer.get("env") or [] if e.get("name") == DEPS_TIMEOUT_ENV), "")
    return {"priority": str((meta.get("labels") or {}).get(PRIORITY_LABEL) or ""), "ttl": str((meta.get("annotations") or {}).get(TTL_ANNOTATION) or ""),
            "grace_seconds": grace.group(1) if grace else "", "deps_timeout": "" if deps == str(DEFAULT_DEPS_TIMEOUT_S) else deps}


def clone_form(found: dict[str, Any]) -> dict[str, Any]:
    """The form of a job as it was submitted (``found``: a backend's ``submitted_form``): resubmitted
    unchanged, it builds the same TrainJob and ConfigMap (but the job's name, left empty)."""
    tj = found["trainjob"]
    trainer = (tj.get("spec") or {}).get("trainer") or {}
    notes: list[str] = []
    if found.get("code_problem"):
        notes.append(f"The code is not carried: {found['code_problem']}; paste or upload it.")
    files = objects.code_files(found["configmap"], tj) if found.get("configmap") is not None else {}
    command = objects.command_of(tj, set(files) if found.get("configmap") is not None else None)
    if command is None:
        notes.append("The command is not carried: the job's is not one trainctl or the portal writes; enter it.")
    boxes = {}
    for rel in (TRAIN_PY, REQUIREMENTS_FILE):
        content = files.get(rel)
        if isinstance(content, str) and "\r" not in content:  # a file with CRs of its own stays carried byte for byte
            boxes[rel] = files.pop(rel)
    env, secret_env = _user_env(trainer.get("env") or [], notes)
    runtime = str(((tj.get("spec") or {}).get("runtimeRef") or {}).get("name", ""))
    resources = trainer.get("resourcesPerNode") or {}
    nodes = int(trainer.get("numNodes") or 1)
    return {
        "framework": "tensorflow" if runtime.startswith(TF_RUNTIME) else "pytorch", "num_nodes": nodes, "preset": "custom",
        "gpu_per_node": (resources.get("limits") or {}).get("nvidia.com/gpu", ""), "cpu_per_node": _whole((resources.get("requests") or {}).get("cpu")),
        "memory_per_node": _gib((resources.get("requests") or {}).get("memory")), "instance_type": objects.instance_type_of(tj) or "", "image": trainer.get("image") or "", "name": "",
        "command": shlex.join(command) if command else "", "code_source": "paste", "training_code": boxes.get(TRAIN_PY, ""), "requirements": boxes.get(REQUIREMENTS_FILE, ""),
        "carried": encode_carried(files), "keep_carried": "1", "env": env, "secret_env": secret_env, "notes": notes, "image_choice": "custom" if trainer.get("image") else "builtin",
        **options_of(tj),
    }


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def _assignments(text: str, flag: str) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """A box's ``NAME=VALUE`` lines (blank lines skipped) by trainctl's parser of ``flag``."""
    found, lines = job_env.parse_assignments(flag, [line for line in _lf(text).split("\n") if line.strip()], what="entry")
    return tuple(found.items()), lines


def code_parts(form: Mapping[str, str], uploads: list[Part]) -> tuple[list[Part], list[dict[str, str]]]:
    """The job's code from the source the form names (``code_source``: ``paste``, the boxes and the
    carried files; ``upload``, the files alone); nothing chosen is dropped unsaid, no code is refused."""
    source = form.get("code_source") or ("upload" if uploads else "paste")
    if source == "upload":
        if not uploads:
            return [], [{"field": "files", "problem": "required: choose the files or the one archive to upload (or choose 'Paste' and paste train.py)"}]
        return uploads, []
    if uploads:
        return [], [{"field": "files", "problem": "files were chosen, but the code is the pasted one: choose 'Upload' to send them, or clear the file choice"}]
    files, problems = decode_carried(form.get("carried", "")) if form.get("keep_carried") else ({}, [])
    code, requirements = _lf(form.get("training_code", "")), _lf(form.get("requirements", ""))
    if code.strip():
        files[TRAIN_PY] = code.encode("utf-8")
    if requirements.strip():
        files[REQUIREMENTS_FILE] = requirements.encode("utf-8")
        # judged here as trainctl judges a code dir's (trainctl/code.py), so its problems are the box's, with the others
        problems += [{"field": "requirements", "problem": line} for line in requirements_problems(dict(files), {rel: rel for rel in files})]
    if not problems and not any(rel != REQUIREMENTS_FILE for rel in files):
        problems.append({"field": "training_code", "problem": "required: paste the training program (train.py), or choose 'Upload' and upload files or an archive"})
    return [Part(rel, data) for rel, data in sorted(files.items())], problems


def submission(form: Mapping[str, str], uploads: list[Part], namespace: str, *, local: bool) -> tuple[JobSpec, list[Part], list[dict[str, str]]]:
    """(the job, its code, every problem of the form at once): the boxes by trainctl's rules, the
    job by the backend's (:func:`trainctl.portal.submission.request_of`; ``local``: ``trainctl ui --local``)."""
    preset = PRESETS.get(form.get("preset", ""), PRESETS["custom"])
    if "gpus" in preset:
        gpus, cpus, memory, itype = preset["gpus"], preset["cpus"], preset["memory"], None
    else:
        gpus, cpus, memory, itype = form.get("gpu_per_node"), form.get("cpu_per_node") or None, form.get("memory_per_node") or None, (form.get("instance_type") or "").strip() or None
    env, lines = _assignments(form.get("env", ""), "--env")
    secret_env, more = _assignments(form.get("secret_env", ""), "--secret-env")
    problems = _from_trainctl(lines + more)
    parts, code_problems = code_parts(form, uploads)
    image = form.get("image") if form.get("image_choice") == "custom" else None
    ttl, ttl_lines = objects.ttl_flag((form.get("ttl") or "").strip() or None)  # trainctl's --ttl: 2h, 1h30m or seconds
    problems += _from_trainctl(ttl_lines)
    spec = JobSpec(namespace=namespace, framework=form.get("framework", ""), num_nodes=form.get("num_nodes"), gpu_per_node=gpus, cpu_per_node=cpus, memory_per_node=memory,
                   command=form.get("command") or "python train.py", name=form.get("name") or None, image=image or None, instance_type=itype, env=env, secret_env=secret_env,
                   ttl_seconds=ttl, priority=(form.get("priority") or "").strip() or None, grace_seconds=(form.get("grace_seconds") or "").strip() or None,
                   deps_timeout=(form.get("deps_timeout") or "").strip() or None)
    try:
        request_of(spec, None, local=local)
    except Problems as err:
        problems += err.problems  # the pairs that parsed (a malformed line is not among them)
    return spec, parts, problems + code_problems


def problem_view(problems: list[dict[str, str]]) -> list[dict[str, str]]:
    """The problems as the page shows them: each with an id (its message's), the control it is
    about (``target``, for aria-describedby and the summary's link) and that control's label."""
    out = []
    for i, p in enumerate(problems):
        target, label = CONTROLS.get(p.get("field", ""), ("", p.get("field", "")))
        out.append({**p, "id": f"error-{i + 1}", "target": target, "label": label})
    return out
