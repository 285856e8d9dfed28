"""Run a rendered TrainJob on this machine the way Kubeflow Trainer runs it on nodes.

The stack is rendered with the mock runtime; the TrainJob, its ClusterTrainingRuntime and its
code ConfigMap are read from the rendered manifests. Each node is one process group started
with the environment the Trainer injects (``PET_NNODES``, ``PET_NPROC_PER_NODE`` from the
TrainJob's ``trainer.numProcPerNode``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
``PET_MASTER_PORT``) and the container command and arguments exactly as rendered; mount paths
are mapped to local directories (the ConfigMap's files for the code volume, a persistent
directory for the checkpoint claim). CPU and gloo, with the tiny profile appended to the
arguments. Replicated jobs that ``node`` ``dependsOn`` (initializers) run to completion first.

Failures are handled as Kubernetes and JobSet would, from the rendered runtime: a failed pod
is matched against the Job's ``podFailurePolicy`` (a ``FailJob`` rule fails the Job with reason
``PodFailurePolicy`` and Kubernetes' message, e.g. ``Container node for pod training/x failed
with exit code 3 matching FailJob rule at index 0``; otherwise ``backoffLimit: 0`` fails it
with ``BackoffLimitExceeded``), and the failed Job against the JobSet ``failurePolicy`` rules
(``onJobFailureReasons``, ``onJobFailureMessagePatterns`` as regular expressions,
``targetReplicatedJobs``): ``FailJobSet`` ends the job as Failed at once, ``RestartJobSet`` (also
the default) restarts every node up to ``maxRestarts``, ``RestartJobSetAndIgnoreMaxRestarts``
restarts without counting. ``--fail-node N --fail-at-step K`` SIGKILLs node N's processes once:
the node's environment carries ``TRAINING_FAULT_AT_STEP=K`` on the first attempt, and the
training library kills the node's process group right after step K (exactly there, however
fast the steps run). Temporary directories (the default work directory, each pod's ``TMPDIR``)
are removed at the end.

The image's ``python``/``python3`` is this interpreter, or ``--python``: the TensorFlow job
(``--job tf``) runs with the TensorFlow virtualenv ``.venv-tf`` that ``make emulate JOB=tf``
creates from workloads/requirements-tf.txt. Its runtime's wrapper command (TF_CONFIG from the
injected ``PET_*``) runs as rendered; every node is on this host, so the wrapper gives each
TensorFlow worker its own port from ``TF_PORT``. The summary line of the all-reduce check
(``--job nccl-check``) adds the bus bandwidth it measured (``busbw_gbps``).

``--trainjob FILE`` runs the TrainJob that ``trainctl submit --dry-run`` printed (its code
ConfigMap and TrainJob) on the runtime the stack renders, with the user's command as is.

Usage: python -m tools.emulate --stack dev --job ddp [--fail-node 1 --fail-at-step 5]
       python -m tools.emulate --trainjob job.yaml [--stack dev]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from config.stack_file import StackFileError
from manifests import trainer_api
from manifests.trainjobs import JOB_LABEL, TF_RUNTIME, TINY_PROFILE, WORKLOAD_BY_KIND
from tools.mock_runtime import ProgramError, run_program
from tools.render import PROJECT_DIR, manifests

TF_VENV = ".venv-tf"  # make emulate JOB=tf: TensorFlow for the TF job (workloads/requirements-tf.txt)

FAULT_ENV = "TRAINING_FAULT_AT_STEP"  # read by workloads/programs/trainlib.py

EVENT = re.compile(r"^TRAINING_EVENT (\{.*\})$")

# Kubernetes' Job failure reasons and messages (pkg/controller/job), JobSet's (pkg/constants).
POD_FAILURE_POLICY = "PodFailurePolicy"
BACKOFF_LIMIT_EXCEEDED = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
DEADLINE_EXCEEDED = ("DeadlineExceeded", "Job was active longer than specified deadline")
FAIL_JOBSET = ("FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action")
REACHED_MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
POD_FAILURE_ACTIONS = ("FailJob", "Count")  # Ignore and FailIndex would need per-pod retries
JOBSET_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")


class EmulationError(Exception):
    pass


@dataclass
class InitJob:
    """A replicated job that ``node`` depends on (``dependsOn: [{name, status: Complete}]``)."""

    name: str
    replicas: int
    command: list[str]
    env: dict[str, str]
    container: str
    pod_failure_policy: dict


@dataclass
class Job:
    name: str
    kind: str
    num_nodes: int
    command: list[str]
    env: dict[str, str]
    max_restarts: int
    mounts: dict[str, str]  # container path -> local path
    nproc_per_node: int = 1
    namespace: str = "default"
    pod_failure_policy: dict = field(default_factory=dict)  # the node Job's
    failure_policy: dict | None = None  # the JobSet's (None: any failed Job fails the JobSet)
    last_step: int | None = None  # the tiny profile's --max-steps
    init_jobs: list[InitJob] = field(default_factory=list)
    python: str = sys.executable  # stands for the image's python/python3

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.nproc_per_node


@dataclass
class PodExit:
    pod: str
    exit_code: int
    conditions: list[dict] = field(default_factory=list)  # pod status conditions ({type, status})


@dataclass
class Attempt:
    events: list[dict] = field(default_factory=list)
    exit_codes: dict[int, int] = field(default_factory=dict)
    failed: list[PodExit] = field(default_factory=list)  # pods that failed on their own (not stopped by us)
    failed_job: str = trainer_api.TRAINER_JOB  # the replicated job whose Job failed
    timed_out: bool = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sized_profile(profile: list[str], world_size: int) -> list[str]:
    """The tiny profile with enough synthetic samples that every rank reaches ``--max-steps`` in
    one epoch, whatever the world size (each rank takes batch-size samples per step)."""
    out = list(profile)
    steps, batch = max_steps(out), _last_int(out, "--batch-size")
    if steps and batch and "--synthetic-samples" in out:
        i = len(out) - 1 - out[::-1].index("--synthetic-samples")
        out[i + 1] = str(max(int(out[i + 1]), steps * batch * world_size))
    return out


def _last_int(args: list[str], flag: str) -> int | None:
    """The last value of ``flag`` in an argument list, as ``flag N`` or ``flag=N`` (argparse: the
    last one wins)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = int(args[i + 1])
        elif a.startswith(flag + "="):
            value = int(a.split("=", 1)[1])
    return value


def max_steps(args: list[str]) -> int | None:
    """The last ``--max-steps`` value of an argument list."""
    return _last_int(args, "--max-steps") or None


def _nproc_per_node(trainer: dict, runtime: dict) -> int:
    """``trainer.numProcPerNode`` of the TrainJob, else the runtime's ``mlPolicy.torch`` one;
    ``auto``/``gpu`` count the GPUs the node requests (one process per GPU, as on a node)."""
    value = trainer.get("numProcPerNode", runtime.get("mlPolicy", {}).get("torch", {}).get("numProcPerNode", 1))
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        n = int(value)
    elif value in ("auto", "gpu"):
        res = trainer.get("resourcesPerNode", {})
        n = int(res.get("limits", {}).get("nvidia.com/gpu", res.get("requests", {}).get("nvidia.com/gpu", 1)))
    else:
        raise EmulationError(f"numProcPerNode {value!r} is not emulated")
    if n < 1:
        raise EmulationError(f"numProcPerNode {value!r} gives no process")
    return n


def _check_policies(job_name: str, pfp: dict, fp: dict | None) -> None:
    for i, rule in enumerate(pfp.get("rules", [])):
        if rule.get("action") not in POD_FAILURE_ACTIONS:
            raise EmulationError(f"{job_name}: podFailurePolicy rule {i} action {rule.get('action')!r} is not emulated (only {', '.join(POD_FAILURE_ACTIONS)})")
    for i, rule in enumerate((fp or {}).get("rules", [])):
        if rule.get("action") not in JOBSET_ACTIONS:
            raise EmulationError(f"failurePolicy rule {rule.get('name', i)!r} action {rule.get('action')!r} is not emulated")


def default_python(kind: str) -> str:
    """The interpreter a job kind's image python stands for here: the TensorFlow virtualenv for
    jobs on the tensorflow runtime, else this one."""
    workload = WORKLOAD_BY_KIND.get(kind)
    if workload is None or workload.runtime != TF_RUNTIME:
        return sys.executable
    python = os.path.join(PROJECT_DIR, TF_VENV, "bin", "python")
    if not os.path.exists(python):
        raise EmulationError(f"job {kind} needs TensorFlow: `make emulate JOB={kind}` creates {TF_VENV} from workloads/requirements-tf.txt (or pass --python)")
    return python


def load_job(stack: str, kind: str, work_dir: str, stack_config: dict | None = None, python: str | None = None, hub_dir: str | None = None) -> Job:
    """Render the stack and turn the TrainJob for ``kind`` into a local Job (``hub_dir``: the
    local hub for the emulated initializers; default a fixture hub in ``work_dir``)."""
    python = python or default_python(kind)
    try:
        run = run_program(PROJECT_DIR, stack, stack_config=stack_config)
    except (ProgramError, StackFileError, FileNotFoundError) as err:
        raise EmulationError(str(err)) from None
    return job_from_objects(list(manifests(run).values()), stack, kind, work_dir, python=python, hub_dir=hub_dir)


def write_configmap(cm: dict, items: list[dict] | None, local: str) -> None:
    """A configMap volume's files as the kubelet projects them: every key at its own name, or with
    ``items`` only the listed keys at their paths; ``binaryData`` decoded."""
    import base64

    files: dict[str, bytes] = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
    files.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    targets = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in files]
    for key, path in targets:
        if key not in files:
            raise EmulationError(f"ConfigMap {cm['metadata']['name']} has no key {key!r} (volume items)")
        dest = os.path.join(local, path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as fh:
            fh.write(files[key])


# --- a TrainJob file (trainctl submit --dry-run) -----------------------------------------------


def load_trainjob_file(path: str, stack: str, work_dir: str, python: str | None = None, stack_config: dict | None = None) -> Job:
    """The local Job of a TrainJob file (``trainctl submit --dry-run`` output: its code ConfigMap
    and the TrainJob) on the runtime the stack renders. A runtimeRef that names no rendered
    runtime is matched by the runtime's base label (``training-platform/runtime``), saying so:
    the file may have been written for the platform's defaults. Nothing is appended to the
    command (the program is the user's, not a platform job with a tiny profile)."""
    import yaml

    from manifests.runtimes import FRAMEWORK_LABEL, RUNTIME_LABEL

    try:
        with open(path) as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d]
    except (OSError, yaml.YAMLError) as err:
        raise EmulationError(f"{path}: {err}") from None
    objs = [i for d in docs for i in (d.get("items", []) if d.get("kind") == "List" else [d])]
    trainjobs = [o for o in objs if o.get("kind") == "TrainJob"]
    if len(trainjobs) != 1:
        raise EmulationError(f"{path}: expected one TrainJob, found {len(trainjobs)}")
    tj = trainjobs[0]
    try:
        run = run_program(PROJECT_DIR, stack, stack_config=stack_config)
    except (ProgramError, StackFileError, FileNotFoundError) as err:
        raise EmulationError(str(err)) from None
    runtimes = [o for o in manifests(run).values() if o["kind"] == "ClusterTrainingRuntime"]
    ref = tj["spec"]["runtimeRef"]["name"]
    runtime = next((r for r in runtimes if r["metadata"]["name"] == ref), None)
    if runtime is None:
        base = re.sub(r"-[0-9a-f]{8}$", "", ref)
        runtime = next((r for r in runtimes if r["metadata"].get("labels", {}).get(RUNTIME_LABEL) == base), None)
        if runtime is None:
            raise EmulationError(f"TrainJob {tj['metadata']['name']} references runtime {ref}; stack {stack} renders no runtime {base}")
        print(f"emulate: note: stack {stack} renders {base} as {runtime['metadata']['name']}, not {ref}: using it", flush=True)
        tj = {**tj, "spec": {**tj["spec"], "runtimeRef": {**tj["spec"]["runtimeRef"], "name": runtime["metadata"]["name"]}}}
    if python is None and runtime["metadata"].get("labels", {}).get(FRAMEWORK_LABEL) == "tensorflow":
        python = os.path.join(PROJECT_DIR, TF_VENV, "bin", "python")
        if not os.path.exists(python):
            raise EmulationError(f"a tensorflow job needs TensorFlow: `make venv-tf` creates {TF_VENV} (or pass --python)")
    kind = tj["metadata"].get("labels", {}).get(JOB_LABEL, "")
    tj = {**tj, "metadata": {**tj["metadata"], "labels": {**tj["metadata"].get("labels", {}), JOB_LABEL: kind}}}
    others = [o for o in objs if o.get("kind") == "ConfigMap"]
    return job_from_objects([tj, runtime, *others], stack, kind, work_dir, python=python or sys.executable, profile=[])


def _volume_dir(vol: dict, vm: dict, env: dict[str, str], work_dir: str) -> str:
    """The local directory of a pod volume mount: a claim's directory (one per claim, shared by
    every pod as the RWX claim is), plus ``subPath`` or ``subPathExpr`` expanded with the
    container's env as the kubelet does; any other volume a directory of its own."""
    if "persistentVolumeClaim" in vol:
        local = os.path.join(work_dir, "volumes", vol["persistentVolumeClaim"]["claimName"])
    else:
        local = os.path.join(work_dir, "volumes", vm["name"])
    sub = vm.get("subPath") or re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), ""), vm.get("subPathExpr", ""))
    local = os.path.join(local, sub) if sub else local
    os.makedirs(local, exist_ok=True)
    return local


def _trainer_initializer(rj: dict, tj: dict, work_dir: str, hub_dir: str | None) -> InitJob | None:
    """The Trainer's dataset/model initializer job of the runtime, as the Trainer fills it from the
    TrainJob (manifests.trainer_api: STORAGE_URI from ``spec.initializer.<kind>.storageUri``, its
    ``env``), run as :mod:`tools.fixture_hub`'s emulated initializer against a local hub. None for
    other replicated jobs. Downward-API env resolves ``metadata.labels['jobset.sigs.k8s.io/jobset-name']``
    to the TrainJob's name (the JobSet's). A ``secretRef`` is not emulated (no Secrets here; the
    local hub needs no token). ``hub_dir`` None: a fixture hub under ``work_dir`` with tiny
    stand-ins for the repos the TrainJob names."""
    from manifests.runtimes import ANCESTOR_LABEL, JOBSET_NAME_LABEL
    from tools import fixture_hub

    ancestor = rj["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL)
    kind = fixture_hub.KINDS.get(ancestor or "")
    pod = rj["template"]["spec"]["template"]["spec"]
    container = next((c for c in pod["containers"] if c["name"] == ancestor), None)
    if kind is None or container is None:
        return None
    labels = {JOBSET_NAME_LABEL: tj["metadata"]["name"]}
    env: dict[str, str] = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", ref)
        env[e["name"]] = labels.get(m.group(1), "") if m else e.get("value", "")
    source = tj["spec"].get("initializer", {}).get(kind)
    if source is not None:
        if source.get("storageUri"):
            env[trainer_api.STORAGE_URI_ENV] = source["storageUri"]
        env.update({e["name"]: e.get("value", "") for e in source.get("env", [])})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {vm["mountPath"]: _volume_dir(volumes[vm["name"]], vm, env, work_dir) for vm in container.get("volumeMounts", [])}
    workspace = mounts.get(trainer_api.INITIALIZER_WORKSPACE)
    if workspace is None:
        raise EmulationError(f"{rj['name']}: no volume at {trainer_api.INITIALIZER_WORKSPACE}, where the initializer writes: its downloads would be lost with the pod")
    if hub_dir is None:
        hub_dir = os.path.join(work_dir, "hub")
        uri = env.get(trainer_api.STORAGE_URI_ENV)
        if uri:
            repo = fixture_hub.repo_id(uri, kind)
            fixture_hub.build(hub_dir, datasets=[repo] if kind == "dataset" else [], models=[repo] if kind == "model" else [])
    env["PYTHONPATH"] = PROJECT_DIR  # the emulated initializer is this project's module
    command = [sys.executable, "-m", "tools.fixture_hub", "initialize", "--kind", kind, "--hub", hub_dir, "--workspace", workspace]
    pfp = rj["template"]["spec"].get("podFailurePolicy", {})
    _check_policies(rj["name"], pfp, None)
    return InitJob(name=rj["name"], replicas=int(rj.get("replicas", 1)), command=command, env=env, container=container["name"], pod_failure_policy=pfp)


def job_from_objects(
    objs: list[dict], stack: str, kind: str, work_dir: str, python: str = sys.executable, profile: list[str] | None = None, hub_dir: str | None = None
) -> Job:
    """The local Job of the TrainJob for ``kind`` among rendered objects; ``python`` stands for
    the image's interpreter; ``profile``: arguments appended (default: the kind's tiny profile);
    ``hub_dir``: the local hub the emulated Trainer initializers read (default: a fixture hub)."""
    profile = TINY_PROFILE[kind] if profile is None else profile
    jobs = [o for o in objs if o["kind"] == "TrainJob" and o["metadata"].get("labels", {}).get(JOB_LABEL) == kind]
    if not jobs:
        raise EmulationError(f"stack {stack} renders no TrainJob for job {kind!r} (enable trainjobs.{kind}.enabled)")
    tj = jobs[0]
    spec = tj["spec"]
    runtime_name = spec["runtimeRef"]["name"]
    runtimes = [o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["name"] == runtime_name]
    if not runtimes:
        raise EmulationError(f"TrainJob {tj['metadata']['name']} references runtime {runtime_name}, which the stack does not render")
    runtime = runtimes[0]["spec"]
    jobset_spec = runtime["template"]["spec"]
    failure_policy = jobset_spec.get("failurePolicy")
    max_restarts = (failure_policy or {}).get("maxRestarts", 0)
    replicated = {j["name"]: j for j in jobset_spec["replicatedJobs"]}
    node_job = replicated[trainer_api.TRAINER_JOB]
    node_container = next(c for c in node_job["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == trainer_api.TRAINER_JOB)
    pod_failure_policy = node_job["template"]["spec"].get("podFailurePolicy", {})
    _check_policies(trainer_api.TRAINER_JOB, pod_failure_policy, failure_policy)

    pod = trainer_api.read_pod_customization(spec)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    container = next((c for c in pod.get("containers", []) if c["name"] == trainer_api.TRAINER_JOB), {})
    mounts: dict[str, str] = {}
    for vm in container.get("volumeMounts", []):
        vol = volumes[vm["name"]]
        if "configMap" in vol:
            cm = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == vol["configMap"]["name"]]
            if not cm:
                raise EmulationError(f"ConfigMap {vol['configMap']['name']} is not rendered")
            local = os.path.join(work_dir, "configmaps", vol["configMap"]["name"])
            shutil.rmtree(local, ignore_errors=True)
            os.makedirs(local)
            write_configmap(cm[0], vol["configMap"].get("items"), local)
        elif "persistentVolumeClaim" in vol:
            local = os.path.join(work_dir, "volumes", vol["persistentVolumeClaim"]["claimName"])
            os.makedirs(local, exist_ok=True)
        else:
            local = os.path.join(work_dir, "volumes", vm["name"])
            os.makedirs(local, exist_ok=True)
        mounts[vm["mountPath"]] = local

    def local_path(value: str) -> str:
        for path in sorted(mounts, key=len, reverse=True):
            if value == path or value.startswith(path + "/"):
                return mounts[path] + value[len(path) :]
        return value

    def local_command(command: list[str]) -> list[str]:
        command = [local_path(a) for a in command]
        if command and command[0] in ("python", "python3"):
            command = [python] + command[1:]  # the image's interpreter
        return command

    init_jobs = []
    for dep in node_job.get("dependsOn", []):
        if dep["name"] not in replicated:
            raise EmulationError(f"replicated job node dependsOn {dep['name']!r}, which the runtime does not have")
        if dep.get("status", "Complete") != "Complete":
            raise EmulationError(f"dependsOn {dep['name']} status {dep.get('status')!r} is not emulated (only Complete)")
        rj = replicated[dep["name"]]
        trainer_init = _trainer_initializer(rj, tj, work_dir, hub_dir)
        if trainer_init is not None:
            init_jobs.append(trainer_init)
            continue
        c = rj["template"]["spec"]["template"]["spec"]["containers"][0]
        pfp = rj["template"]["spec"].get("podFailurePolicy", {})
        _check_policies(rj["name"], pfp, None)
        init_jobs.append(InitJob(
            name=rj["name"], replicas=int(rj.get("replicas", 1)), command=local_command(c.get("command", []) + c.get("args", [])),
            env={e["name"]: local_path(e.get("value", "")) for e in c.get("env", [])}, container=c["name"], pod_failure_policy=pfp,
        ))

    trainer = spec["trainer"]
    num_nodes = int(trainer.get("numNodes", runtime.get("mlPolicy", {}).get("numNodes", 1)))
    nproc = _nproc_per_node(trainer, runtime)
    command = local_command(trainer.get("command", node_container.get("command", [])))
    args = trainer.get("args", node_container.get("args", []))
    # args that start with an interpreter are the command a wrapper execs (the TF_CONFIG wrapper)
    args = local_command(args) if args and args[0] in ("python", "python3") else [local_path(a) for a in args]
    env = {e["name"]: local_path(e.get("value", "")) for e in node_container.get("env", []) + trainer.get("env", [])}
    return Job(
        name=tj["metadata"]["name"], kind=kind, num_nodes=num_nodes,
        command=command + args + sized_profile(profile, num_nodes * nproc), env=env, max_restarts=int(max_restarts), mounts=mounts,
        nproc_per_node=nproc, namespace=tj["metadata"].get("namespace", "default"),
        pod_failure_policy=pod_failure_policy, failure_policy=failure_policy, last_step=max_steps(profile), init_jobs=init_jobs,
        python=python,
    )


# --- failure policies --------------------------------------------------------------------------


def _rule_matches_pod(rule: dict, container: str, pod: PodExit) -> str | None:
    """Kubernetes' message when a podFailurePolicy rule matches the failed pod, else None."""
    on_codes = rule.get("onExitCodes")
    if on_codes is not None:
        if on_codes.get("containerName") not in (None, container) or pod.exit_code == 0:
            return None
        inside = pod.exit_code in on_codes.get("values", [])
        if inside == (on_codes.get("operator", "In") == "In"):
            return f"Container {container} for pod {{pod}} failed with exit code {pod.exit_code} matching {rule['action']} rule at index {{index}}"
        return None
    for cond in rule.get("onPodConditions", []):
        if any(c.get("type") == cond["type"] and c.get("status", "True") == cond.get("status", "True") for c in pod.conditions):
            return f"Pod {{pod}} has condition {cond['type']} matching {rule['action']} rule at index {{index}}"
    return None


def job_failure(pod_failure_policy: dict, container: str, namespace: str, failed: list[PodExit]) -> tuple[str, str]:
    """(reason, message) of a Job with ``backoffLimit: 0`` whose pods ``failed``, as the Job
    controller sets them: the first rule that matches a pod decides; FailJob fails the Job with
    reason PodFailurePolicy, Count (or no rule) counts the failure, which exceeds the backoff limit."""
    for pod in failed:
        for index, rule in enumerate(pod_failure_policy.get("rules", [])):
            message = _rule_matches_pod(rule, container, pod)
            if message is None:
                continue
            if rule["action"] == "FailJob":
                return POD_FAILURE_POLICY, message.format(pod=f"{namespace}/{pod.pod}", index=index)
            break  # Count: an ordinary failure
    return BACKOFF_LIMIT_EXCEEDED


def jobset_rule(failure_policy: dict | None, replicated_job: str, reason: str, message: str) -> dict | None:
    """The first JobSet failurePolicy rule that applies to a failed Job, else None."""
    for rule in (failure_policy or {}).get("rules", []):
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns")
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        if rule.get("targetReplicatedJobs") and replicated_job not in rule["targetReplicatedJobs"]:
            continue
        return rule
    return None


# --- processes ---------------------------------------------------------------------------------


def _pod_env(job: Job, extra: dict[str, str], tmp: str, fault_step: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(FAULT_ENV, None)
    env.update(extra)
    if fault_step is not None:
        env[FAULT_ENV] = str(fault_step)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # torchrun of this environment
    os.makedirs(tmp, exist_ok=True)
    env.update(TMPDIR=tmp, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports that are free now."""
    for _ in range(50):
        base = _free_port()
        if base + n > 65536:
            continue
        with contextlib.ExitStack() as held:
            try:
                for p in range(base, base + n):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
        return base
    raise EmulationError(f"no {n} consecutive free ports")


def _node_env(job: Job, node: int, port: int, fault_step: int | None, tmp: str, tf_port: int) -> dict[str, str]:
    env = _pod_env(job, job.env, tmp, fault_step)
    env.update(
        PET_NNODES=str(job.num_nodes), PET_NPROC_PER_NODE=str(job.nproc_per_node), PET_NODE_RANK=str(node),
        PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port),
        TF_PORT=str(tf_port),  # the TF_CONFIG wrapper (incluster/tf_config.py): worker i listens on TF_PORT + i here
    )
    return env


def _container_exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode  # killed by signal N: 128 + N


def _run_pods(commands: list[tuple[list[str], dict[str, str]]], pod_names: list[str], label: str, timeout_s: float, quiet: bool) -> Attempt:
    """Start every pod, stop them all on the first failure (a distributed job needs every one)."""
    result = Attempt()
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []

    def kill(p: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)

    def pump(n: int) -> None:
        stdout = procs[n].stdout
        assert stdout is not None  # stdout=PIPE
        for line in stdout:
            line = line.rstrip("\n")
            m = EVENT.match(line)
            if m:
                ev = json.loads(m.group(1))
                with lock:
                    result.events.append(ev)
            if not quiet and not line.startswith(("W1", "I1", "[W")):
                print(f"[{label} {n}] {line}", flush=True)

    readers: list[threading.Thread] = []
    try:
        for command, env in commands:
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        readers = [threading.Thread(target=pump, args=(n,), daemon=True) for n in range(len(procs))]
        for t in readers:
            t.start()
        deadline = time.monotonic() + timeout_s
        while True:
            codes = {n: p.poll() for n, p in enumerate(procs)}
            failed = {n: c for n, c in codes.items() if c not in (None, 0)}
            if failed or all(c == 0 for c in codes.values()):
                break
            if time.monotonic() > deadline:
                print(f"emulate: {label} timed out after {timeout_s:.0f}s", flush=True)
                result.timed_out = True
                break
            time.sleep(0.1)
        result.failed = [PodExit(pod_names[n], _container_exit_code(c)) for n, c in sorted(failed.items())]
    finally:  # like the JobSet: one failed pod fails the attempt; the others are stopped (also on errors here)
        for p in procs:
            if p.poll() is None:
                kill(p)
        for n, p in enumerate(procs):
            p.wait()
            result.exit_codes[n] = _container_exit_code(p.returncode)
        for t in readers:
            t.join(timeout=5)
        for p in procs:
            if p.stdout is not None:
                p.stdout.close()
    return result


def run_attempt(job: Job, attempt_no: int, fail: dict | None, timeout_s: float, quiet: bool, tmp_root: str) -> Attempt:
    """Run the initializers, then every node; watch rank 0's events and inject the failure."""
    tmp = os.path.join(tmp_root, f"attempt-{attempt_no}")
    for init in job.init_jobs:
        names = [f"{job.name}-{init.name}-0-{i}" for i in range(init.replicas)]
        cmds = [(init.command, _pod_env(job, init.env, os.path.join(tmp, init.name, str(i)), None)) for i in range(init.replicas)]
        result = _run_pods(cmds, names, f"attempt {attempt_no} {init.name}", timeout_s, quiet)
        if result.failed or result.timed_out:
            result.failed_job = init.name
            return result
    port, tf_port = _free_port(), _free_ports(job.num_nodes)
    inject = fail if fail is not None and not fail.get("done") else None  # the failure this attempt injects
    if inject is not None:
        inject["done"] = True  # once: later attempts run clean
        print(f"emulate: node {inject['node']} will be SIGKILLed at step {inject['step']}", flush=True)

    def fault_step(n: int) -> int | None:
        return inject["step"] if inject is not None and n == inject["node"] else None

    names = [f"{job.name}-{trainer_api.TRAINER_JOB}-0-{n}" for n in range(job.num_nodes)]
    cmds = [(job.command, _node_env(job, n, port, fault_step(n), os.path.join(tmp, f"node-{n}"), tf_port)) for n in range(job.num_nodes)]
    return _run_pods(cmds, names, f"attempt {attempt_no} node", timeout_s, quiet)


@contextlib.contextmanager
def _temp_root(prefix: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def check_fault(job: Job, fail_node: int | None, fail_at_step: int | None) -> None:
    if fail_node is not None and not 0 <= fail_node < job.num_nodes:
        raise EmulationError(f"--fail-node {fail_node} is not a node of the job (0..{job.num_nodes - 1})")
    if fail_at_step is not None:
        check_fail_step(fail_at_step, job.last_step)


def check_fail_step(step: int, last_step: int | None) -> None:
    if step < 1:
        raise EmulationError(f"--fail-at-step {step}: steps start at 1")
    if last_step is not None and step > last_step:
        raise EmulationError(f"--fail-at-step {step} is beyond the last step of the run ({last_step}, the tiny profile's --max-steps)")


def emulate(job: Job, *, fail_node: int | None, fail_at_step: int | None, timeout_s: float = 900, quiet: bool = False) -> dict:
    check_fault(job, fail_node, fail_at_step)
    fail = {"node": fail_node, "step": fail_at_step} if fail_node is not None and fail_at_step is not None else None
    restarts = counted = 0
    reason = message = None
    failed_job = ""
    with _temp_root(f"emulate-{job.name}-") as tmp_root:
        while True:
            attempt = run_attempt(job, restarts, fail, timeout_s, quiet, tmp_root)
            if not attempt.failed and not attempt.timed_out:
                status = "Complete"
                break
            init = next((i for i in job.init_jobs if i.name == attempt.failed_job), None)
            pfp, container = (init.pod_failure_policy, init.container) if init else (job.pod_failure_policy, trainer_api.TRAINER_JOB)
            job_reason, job_message = DEADLINE_EXCEEDED if attempt.timed_out else job_failure(pfp, container, job.namespace, attempt.failed)
            failed_job = f"{job.name}-{attempt.failed_job}-0"
            codes = {p.pod: p.exit_code for p in attempt.failed}
            print(f"emulate: Job {failed_job} failed ({job_reason}: {job_message}); exit codes {codes}", flush=True)
            if job.failure_policy is None:
                status, (reason, message) = "Failed", FAILED_JOBS
                break
            rule = jobset_rule(job.failure_policy, attempt.failed_job, job_reason, job_message)
            action = rule["action"] if rule else "RestartJobSet"
            named = f" (rule {rule.get('name')})" if rule else ""
            if action == "FailJobSet":
                status, (reason, message) = "Failed", FAIL_JOBSET
                message += named
                break
            if action == "RestartJobSet":
                if counted >= job.max_restarts:
                    status, (reason, message) = "Failed", REACHED_MAX_RESTARTS
                    message += f" ({job.max_restarts})"
                    break
                counted += 1
            restarts += 1
            print(f"emulate: {action}{named}: restarting all {job.num_nodes} nodes (restart {restarts}, {counted}/{job.max_restarts} counted)", flush=True)
    if reason is not None:
        message = f"{message} (first failed job: {failed_job})"
        print(f"emulate: JobSet failed: {reason}: {message}", flush=True)
    final = next((e for e in reversed(attempt.events) if e.get("event") == "result"), {})
    return {
        "job": job.name, "status": status, "nodes": job.num_nodes, "world_size": job.world_size, "restarts": restarts,
        "resumed_from_step": final.get("resumed_from_step"), "final_step": final.get("final_step"), "final_loss": final.get("final_loss"),
        "busbw_gbps": final.get("busbw_gbps"), "reason": reason, "message": message, "result": final,
    }


def summary_line(r: dict) -> str:
    resumed = "none" if r["resumed_from_step"] is None else r["resumed_from_step"]
    line = (
        f"emulate: job={r['job']} status={r['status']} nodes={r['nodes']} world_size={r['world_size']} restarts={r['restarts']} "
        f"resumed_from_step={resumed} final_step={r['final_step']} final_loss={r['final_loss']}"
    )
    if r.get("busbw_gbps") is not None:  # the all-reduce check's figure
        line += f" busbw_gbps={r['busbw_gbps']}"
    return line + (f" reason={r['reason']}" if r.get("reason") else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run a rendered TrainJob locally (CPU, gloo)")
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--job", choices=sorted(TINY_PROFILE), default="ddp")
    ap.add_argument("--fail-node", type=int)
    ap.add_argument("--fail-at-step", type=int)
    ap.add_argument("--work-dir", help="local volumes, kept (default: a temporary directory, removed at the end)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per attempt")
    ap.add_argument("--quiet", action="store_true", help="only events and the summary")
    ap.add_argument("--python", help=f"interpreter for the image's python3 (default: this one; --job tf: {TF_VENV}/bin/python)")
    ap.add_argument("--trainjob", metavar="FILE", help="run the TrainJob of this file (trainctl submit --dry-run output) on the stack's runtime, instead of --job")
    ap.add_argument("--hub-dir", help="local hub (datasets/<owner>/<name>, models/<owner>/<name>) the emulated initializers read; default: tiny fixtures in the work directory")
    args = ap.parse_args(argv)
    if (args.fail_node is None) != (args.fail_at_step is None):
        ap.error("--fail-node and --fail-at-step go together")
    try:
        if args.fail_at_step is not None:  # before rendering or starting anything
            check_fail_step(args.fail_at_step, None if args.trainjob else max_steps(TINY_PROFILE[args.job]))
        with contextlib.ExitStack() as stack:
            work = args.work_dir or stack.enter_context(_temp_root(f"emulate-{args.stack}-{'trainjob' if args.trainjob else args.job}-"))
            if args.trainjob:
                job = load_trainjob_file(args.trainjob, args.stack, work, python=args.python)
            else:
                job = load_job(args.stack, args.job, work, python=args.python, hub_dir=args.hub_dir)
            for init in job.init_jobs:
                print(f"emulate: {init.name} first ({init.env.get(trainer_api.STORAGE_URI_ENV, 'no ' + trainer_api.STORAGE_URI_ENV)})", flush=True)
            print(
                f"emulate: {job.name}: {job.num_nodes} nodes x {job.nproc_per_node} processes, maxRestarts={job.max_restarts}, volumes: "
                + ", ".join(f"{k} -> {v}" for k, v in job.mounts.items()), flush=True,
            )
            r = emulate(job, fail_node=args.fail_node, fail_at_step=args.fail_at_step, timeout_s=args.timeout, quiet=args.quiet)
    except EmulationError as err:
        print(f"emulate: {err}", file=sys.stderr)
        return 2
    print(summary_line(r), flush=True)
    return 0 if r["status"] == "Complete" else 1

if __name__ == "__main__":
    sys.exit(main())
