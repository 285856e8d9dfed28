"""The emulator's model of a TrainJob: the Job and attempt records, and a Job read from a stack's rendered objects or a TrainJob file, as the Trainer, JobSet and Kubernetes would run it."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field

from config.schema import PROJECT, validate_section
from config.settings import TrainerSettings
from config.stack_file import StackFileError, load_stack_file, namespaced_config
from k8s.builders import trainer_api
from k8s.builders.runtimes import runtimes as declared_runtimes
from workloads.builders.trainjobs import JOB_LABEL, TF_RUNTIME, TINY_PROFILE, WORKLOAD_BY_KIND

# the directory of the platform's stack files: the repository's root in a checkout, trainctl/_platform
# in the installed trainctl (setup.py copies the stack file local mode runs on there)
PROJECT_DIR = str(pathlib.Path(__file__).resolve().parent.parent)
# where this module's top-level package is imported from (the checkout's root, or site-packages)
IMPORT_ROOT = str(pathlib.Path(__file__).resolve().parents[len(__name__.split(".")) - 1])

TF_VENV = ".venv-tf"  # make emulate JOB=tf: TensorFlow for the TF job (workloads/requirements-tf.txt)

FAULT_ENV = "TRAINING_FAULT_AT_STEP"  # read by workloads/programs/trainlib.py
K8S_DEFAULT_GRACE_S = 30  # a pod's grace period when its spec has none
SIGTERM_LINE = "preemption: SIGTERM received"  # workloads/programs/trainlib.py, when the kubelet's SIGTERM arrives

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
    tails: dict[int, list[str]] = field(default_factory=dict)  # each pod's last lines of output


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


def stack_file_path(stack: str) -> str:
    """The stack's file, ``Pulumi.<stack>.yaml`` of :data:`PROJECT_DIR`."""
    return os.path.join(PROJECT_DIR, f"Pulumi.{stack}.yaml")


def stack_runtimes(stack: str, stack_config: dict | None = None) -> list[dict]:
    """The ClusterTrainingRuntimes of the stack's trainer settings (k8s/trainer.py declares the
    builders' ``runtimes`` of them), from its stack file (or ``stack_config``, a stack file's
    content), with the platform's builders and its trainer section's model, without Pulumi: what the
    platform installs but for the registry its images name (the emulator runs no image) and the grace
    variants its own jobs add (a TrainJob that names one gets it: :func:`_with_grace_class`). One
    line (EmulationError) for a stack file or trainer section refused."""
    try:
        raw_file = stack_config if stack_config is not None else load_stack_file(stack_file_path(stack))
        config = namespaced_config(raw_file.get("config") or {})
    except StackFileError as err:
        raise EmulationError(str(err)) from None
    trainer, problems = validate_section(TrainerSettings, config.get(f"{PROJECT}:trainer"), "trainer")
    if not isinstance(trainer, TrainerSettings) or problems:
        raise EmulationError(f"stack {stack}: {problems[0] if problems else 'trainer: not a section'}")
    return list(declared_runtimes(trainer).values())


def load_job(stack: str, kind: str | None, work_dir: str, stack_config: dict | None = None, python: str | None = None, hub_dir: str | None = None, project: str = "") -> Job:
    """Render the stack and turn the TrainJob for ``kind`` into a local Job (``hub_dir``: the
    local hub for the emulated initializers; default a fixture hub in ``work_dir``). ``project``
    ``workloads``: a TrainJob stack, rendered after its platform stack (whose runtime it runs on);
    its one run is the job (``kind`` None). Renders the Pulumi program: runs from the checkout."""
    try:
        from tools import stack_refs
        from tools.mock_runtime import ProgramError, run_program, stack_config_of
        from tools.render import manifests
    except ImportError as err:  # the installed trainctl's emulator: no Pulumi program to render
        raise EmulationError(f"rendering stack {stack}'s jobs needs the platform's checkout and its .venv ({err})") from None
    try:
        if project:
            project_dir = os.path.join(PROJECT_DIR, project)
            platforms = {name: run_program(d, s) for name, (d, s) in stack_refs.referenced_stacks(stack_config_of(project_dir, stack)).items()}
            run = run_program(project_dir, stack, stack_outputs={name: p.outputs for name, p in platforms.items()})
            runtimes = [o for p in platforms.values() for o in manifests(p).values() if o["kind"] == "ClusterTrainingRuntime"]
            objs = [*manifests(run).values(), *runtimes]
            kind = next((o["metadata"]["labels"][JOB_LABEL] for o in objs if o["kind"] == "TrainJob"), kind)
        else:
            run = run_program(PROJECT_DIR, stack, stack_config=stack_config)
            objs = list(manifests(run).values())
    except (ProgramError, StackFileError, FileNotFoundError) as err:
        raise EmulationError(str(err)) from None
    if kind is None:
        raise EmulationError(f"stack {stack} renders no TrainJob")
    return job_from_objects(objs, stack, kind, work_dir, python=python or default_python(kind), hub_dir=hub_dir)


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


def _with_grace_class(stack: str, stack_config: dict | None, grace: int) -> list[dict]:
    """The stack's runtimes with ``grace`` among its ``trainer.graceClasses`` (a TrainJob of
    ``trainctl submit --grace-seconds`` names that variant: k8s/builders/runtimes.py)."""
    import copy

    try:
        config = copy.deepcopy(stack_config) if stack_config is not None else load_stack_file(stack_file_path(stack))
    except StackFileError as err:
        raise EmulationError(str(err)) from None
    trainer = config.setdefault("config", {}).setdefault(f"{PROJECT}:trainer", {})
    trainer["graceClasses"] = sorted({*trainer.get("graceClasses", []), grace})
    return stack_runtimes(stack, config)


def load_trainjob_file(path: str, stack: str, work_dir: str, python: str | None = None, stack_config: dict | None = None) -> Job:
    """The local Job of a TrainJob file (``trainctl submit --dry-run`` output: its code ConfigMap
    and the TrainJob) on the runtime the stack declares (:func:`stack_runtimes`: no Pulumi, so the
    installed trainctl runs it too). A runtimeRef that names no declared runtime is matched by the runtime's base label (``training-platform/runtime``), saying so:
    the file may have been written for the platform's defaults. Nothing is appended to the
    command (the program is the user's, not a platform job with a tiny profile)."""
    import yaml

    from k8s.builders.runtimes import FRAMEWORK_LABEL, RUNTIME_LABEL

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
    runtimes = stack_runtimes(stack, stack_config)
    ref = tj["spec"]["runtimeRef"]["name"]
    runtime = next((r for r in runtimes if r["metadata"]["name"] == ref), None)
    if runtime is None:
        base = re.sub(r"-[0-9a-f]{8}$", "", ref)
        variant = re.fullmatch(r"(.+)-grace(\d+)", base)
        if variant and not any(r["metadata"].get("labels", {}).get(RUNTIME_LABEL) == base for r in runtimes):
            runtimes = _with_grace_class(stack, stack_config, int(variant.group(2)))  # the variant as a stack offering it renders it
        runtime = next((r for r in runtimes if r["metadata"].get("labels", {}).get(RUNTIME_LABEL) == base), None)
        if runtime is None:
            raise EmulationError(f"TrainJob {tj['metadata']['name']} references runtime {ref}; stack {stack} renders no runtime {base}")
        if runtime["metadata"]["name"] != ref:
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
    TrainJob (k8s.builders.trainer_api: STORAGE_URI from ``spec.initializer.<kind>.storageUri``, its
    ``env``), run as :mod:`tools.fixture_hub`'s emulated initializer against a local hub. None for
    other replicated jobs. Downward-API env resolves ``metadata.labels['jobset.sigs.k8s.io/jobset-name']``
    to the TrainJob's name (the JobSet's). A ``secretRef`` is not emulated (no Secrets here; the
    local hub needs no token). ``hub_dir`` None: a fixture hub under ``work_dir`` with tiny
    stand-ins for the repos the TrainJob names."""
    from k8s.builders.runtimes import ANCESTOR_LABEL, JOBSET_NAME_LABEL
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
    env["PYTHONPATH"] = IMPORT_ROOT  # the emulated initializer is this project's module
    command = [sys.executable, "-m", fixture_hub.__name__, "initialize", "--kind", kind, "--hub", hub_dir, "--workspace", workspace]
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
        # the image's interpreter wherever the command names it (also what a launcher runs next:
        # ``python3 launch.py python3 launch.py --worker python3 train.py``)
        return [python if a in ("python", "python3") else local_path(a) for a in command]

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


