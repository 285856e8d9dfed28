"""trainctl's local mode: a job runs on this machine through the emulator (``tools/emulate.py``),
from the same ConfigMap and TrainJob the cluster path creates, in the background, with the Python
environment trainctl runs under (its torch, for the torchrun launcher). The installed trainctl carries
the emulator and the stack file it runs on (``trainctl._platform``, setup.py): no checkout is needed.

State lives in one directory, ``$TRAINCTL_HOME`` (default ``$XDG_STATE_HOME/trainctl``, else
the user's state directory ``.local/state/trainctl`` under ``$HOME``): ``jobs/<name>/`` holds ``objects.yaml`` (what was submitted),
``job.json`` (pid, start time, the command), ``output.log`` (every node's lines, prefixed with
node and rank; capped at ``LOG_MAX_BYTES``: at the cap it moves to ``output.log.1`` and a new one
starts with a line saying so), ``result.json`` (the emulator's summary once it ends) and ``work/``
(the job's volumes: ``work/volumes/checkpoints`` is its ``/mnt/checkpoints``).

A NAME is a job name (the rule ``submit --name`` has) and names a directory right under
``jobs/``, never a symbolic link: nothing outside the state directory is read or removed.
Deleting a job stops every process of it (``trainctl/proctree.py``: each carries the job's marker,
each node runs in a PID namespace of its own where the machine allows it): SIGTERM, the job's
grace period (its ``--grace-seconds``, else its runtime's), then SIGKILL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import yaml

import tools.emulator_objects as emulator_objects  # the emulator's model: where it and its stack files are
from trainctl import objects, proctree, progress
from trainctl.diagnose import DEPS_CAUSE, DEPS_LINE

HOME_ENV = "TRAINCTL_HOME"
STACK = "dev"  # the stack whose runtimes a local job runs on (setup.py ships its file with the installed trainctl)
# the emulator: tools.emulate in a checkout, trainctl._platform.tools.emulate installed (setup.py)
EMULATOR = emulator_objects.__name__.rpartition(".")[0] + ".emulate"
TORCH_HINT = "{python} -m pip install torch (the CPU build is smaller: add --index-url https://download.pytorch.org/whl/cpu)"
NODE_LINE = re.compile(r"^\[attempt (\d+) node (\d+)(?: ranks? [\d-]+)?\] ")
LOG = "output.log"
LOG_MAX_BYTES = 64 * 1024 * 1024  # output.log's cap (tools/emulator_output.py rotates it once: at most twice this on disk)
TAIL_BYTES = 256 * 1024  # what list and status read of a log: its end
EVIDENCE_BYTES = 4 * 1024 * 1024  # what diagnose reads of it
JOB_FILES = {"objects.yaml", "job.json", LOG, f"{LOG}.1", "result.json", "work"}  # what a job's directory holds
STOP_MARGIN_S = 30
MAX_LOCAL_NODES = 16
# one Python process with torch imported and gloo initialized (torchrun, or a worker): ~350 MB of
# proportional set size (PSS, shared pages split), measured on a local node of torch 2.13 CPU: torchrun
# 350 MB, its worker 350 MB, the launchers 7 MB each (a node of one process: ~715 MB)
PROCESS_MEMORY_BYTES = 350 * 10**6  # past the grace period, for the emulator to SIGKILL and leave, before trainctl SIGKILLs what is left


class LocalError(Exception):
    """A local-mode request that cannot be done (one line for the user)."""


def home() -> pathlib.Path:
    if os.environ.get(HOME_ENV):
        return pathlib.Path(os.environ[HOME_ENV])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return pathlib.Path(state) / "trainctl"


def job_dir(name: str) -> pathlib.Path:
    """The directory of the job NAME: refused (one line) unless NAME is a job name, and the path
    a directory right under the state directory's ``jobs/`` (not a symbolic link)."""
    problem = objects.name_problem(name)
    if problem is not None:
        raise LocalError(f"{name!r} is not a local job's name: {problem}")
    root = home() / "jobs"
    d = root / name
    for path in (root, d):
        if path.is_symlink():
            raise LocalError(f"{path} is a symbolic link, not trainctl's directory: left as it is")
    if d.exists() and (not d.is_dir() or d.resolve().parent != root.resolve()):
        raise LocalError(f"{d} is not a job's directory inside {root}: left as it is")
    return d


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat): a pid the system reused is not ours."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def available_memory_bytes() -> int | None:
    """What the kernel says can still be given to programs (``MemAvailable``, /proc/meminfo)."""
    try:
        for line in open("/proc/meminfo"):  # noqa: SIM115 - a tiny read
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def node_memory_bytes(procs_per_node: int) -> int:
    """What one local node takes: its torchrun and a worker per process, each a Python with torch."""
    return (1 + procs_per_node) * PROCESS_MEMORY_BYTES


def node_problems(nodes: int, procs_per_node: int = 1) -> list[str]:
    """A local job's node count against this machine: at most ``MAX_LOCAL_NODES``, and no more
    than its available memory holds (:func:`node_memory_bytes` a node)."""
    each = node_memory_bytes(max(procs_per_node, 1))
    if nodes > MAX_LOCAL_NODES:
        return [f"--nodes {nodes}: a local job runs at most {MAX_LOCAL_NODES} nodes on this machine (each a set of processes of ~{each // 10**6} MB); submit it to a cluster for more"]
    free = available_memory_bytes()
    if free is not None and nodes * each > free:
        fits = free // each
        return [f"--nodes {nodes}: this machine has {free // 2**20} MiB of memory available, room for {fits} local node{'s' if fits != 1 else ''} of ~{each // 10**6} MB; use fewer nodes (or processes) or a cluster"]
    return []


def needs_torch(trainjob: dict) -> bool:
    """Whether the job runs its code with torchrun (the torch runtimes' launcher), which is torch's."""
    trainer = trainjob.get("spec", {}).get("trainer", {})
    return "torchrun" in [*trainer.get("command", []), *trainer.get("args", [])]


def setup_problem(trainjob: dict | None = None) -> str | None:
    """What this installation lacks to run the job locally (one line), or None: the emulator and its
    stack file (the installed trainctl carries both), and torch in this Python environment for a
    job that runs torchrun."""
    if importlib.util.find_spec(EMULATOR) is None or not os.path.isfile(emulator_objects.stack_file_path(STACK)):
        return f"this trainctl installation lacks its local emulator ({EMULATOR}) or stack file {emulator_objects.stack_file_path(STACK)}: reinstall trainctl"
    if trainjob is not None and needs_torch(trainjob) and importlib.util.find_spec("torch") is None:
        return f"this job runs its code with torchrun, which comes with torch; {sys.executable} has no torch: {TORCH_HINT.format(python=sys.executable)}"
    return None


def submit(cm: dict, trainjob: dict, *, stack: str = STACK, timeout_s: float = 3600, grace_s: int | None = None) -> dict:
    """Start the emulator on the objects in the background; refuse a name that exists."""
    if missing := setup_problem(trainjob):
        raise LocalError(missing)
    name = trainjob["metadata"]["name"]
    d = job_dir(name)
    replaced = None
    if d.exists():  # a resubmit: a finished job of the name is replaced (its checkpoints stay), a running one refused
        if result(d) is None and _alive(_state(d)):  # a result written: finished, its emulator may still be leaving
            raise LocalError(f"a local job {name} exists and is running: a job of that name is replaced only once it finished; wait for it, trainctl delete --local {name}, or pass --name")
        replaced = report(name)["phase"]
        delete(name)
    d.mkdir(parents=True)
    # the claim every local job mounts at /mnt/checkpoints, as a team's jobs share its claim: a job's
    # checkpoints outlive it, a resubmit of the name resumes from them, --resume-from reads another's
    (d / "work" / "volumes").mkdir(parents=True)
    for claim_name in claims_of(trainjob):
        claim = home() / "volumes" / claim_name
        claim.mkdir(parents=True, exist_ok=True)
        (d / "work" / "volumes" / claim_name).symlink_to(claim, target_is_directory=True)
    (d / "objects.yaml").write_text(yaml.safe_dump_all([cm, trainjob], sort_keys=False))
    command = [
        sys.executable, "-m", EMULATOR, "--stack", stack, "--trainjob", str(d / "objects.yaml"), "--work-dir", str(d / "work"),
        "--timeout", str(timeout_s), "--result-file", str(d / "result.json"), "--log-file", str(d / LOG), "--log-max-bytes", str(LOG_MAX_BYTES),
    ]
    token = uuid.uuid4().hex  # every process of the job inherits it (proctree.JOB_MARKER)
    env = {**os.environ, proctree.JOB_MARKER: token}
    # the installed emulator (in trainctl's package) is found from anywhere: it runs in the job's directory; a checkout's from its root
    cwd = d / "work" if EMULATOR.startswith(f"{__package__}.") else emulator_objects.IMPORT_ROOT
    with open(d / LOG, "ab") as log:  # what the emulator prints before it opens its log (a crash at start)
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    state = {
        "name": name, "pid": proc.pid, "started": _start_time(proc.pid), "submitted_at": time.time(), "nodes": trainjob["spec"]["trainer"].get("numNodes"), "command": command,
        "marker": token, "grace_seconds": grace_s if grace_s is not None else grace_seconds(trainjob, stack), **({"replaced": replaced} if replaced else {}),
    }
    (d / "job.json").write_text(json.dumps(state, indent=1))
    return state


def claims_of(trainjob: dict) -> list[str]:
    """The claims the job's pods mount (the emulator's ``work/volumes/<claim>``)."""
    from k8s.builders import trainer_api

    volumes = trainer_api.read_pod_customization(trainjob.get("spec", {})).get("volumes", [])
    return sorted({v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v})


def grace_seconds(trainjob: dict, stack: str) -> int:
    """The job's grace period: its own (``submit --grace-seconds``, in its pod patch), else its
    runtime's (the stack's ``trainer.terminationGraceSeconds``, else that key's default)."""
    from config.settings import TrainerSettings
    from config.stack_file import StackFileError, load_stack_file
    from k8s.builders import trainer_api

    own = trainer_api.read_pod_customization(trainjob.get("spec", {})).get("terminationGracePeriodSeconds")
    if own is not None:
        return int(own)
    try:
        raw = load_stack_file(emulator_objects.stack_file_path(stack))
    except StackFileError:
        raw = {}
    trainer = (raw.get("config") or {}).get("training-platform:trainer") or {}
    value = trainer.get("terminationGraceSeconds") if isinstance(trainer, dict) else None
    return int(value) if isinstance(value, int) else int(TrainerSettings().termination_grace_seconds)


def _state(d: pathlib.Path) -> dict:
    try:
        return json.loads((d / "job.json").read_text())
    except (OSError, ValueError):
        return {"name": d.name}


def _zombie(pid: int) -> bool:
    """The process has ended and waits to be reaped (state Z, field 3 of /proc/<pid>/stat): a
    parent that lives on (trainctl ui --local) has not collected it yet."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _alive(state: dict) -> bool:
    pid = state.get("pid")
    return bool(pid) and _start_time(pid) is not None and _start_time(pid) == state.get("started") and not _zombie(pid)


def result(d: pathlib.Path) -> dict | None:
    try:
        return json.loads((d / "result.json").read_text())
    except (OSError, ValueError):
        return None


def report(name: str) -> dict:
    """Phase, restarts, progress and the failure of a local job."""
    d = job_dir(name)
    if not d.exists():
        raise LocalError(f"no local job {name} (trainctl list --local)")
    state, res = _state(d), result(d)
    out: dict[str, Any] = {"name": name, "nodes": state.get("nodes"), "submitted": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(state.get("submitted_at", 0)))}
    if res is not None:
        out.update(phase=res["status"], restarts=res["restarts"], reason=res.get("reason"), message=res.get("message"), failure=res.get("failure"), final_step=res.get("final_step"))
    elif _alive(state):
        out.update(phase="Running")
    else:
        out.update(phase="Failed", reason="EmulatorExited", message=f"the emulator stopped without a result: see {d / 'output.log'}")
    progress = last_progress(d)
    if progress:
        out["progress"] = progress
    for line in (out.get("failure") or {}).get("last_lines", []):  # the launcher's marker (trainctl/diagnose.py DEPS_LINE)
        if m := DEPS_LINE.search(line):
            out["cause"] = f"{DEPS_CAUSE}: {m.group(1)}"
    return out


def last_progress(d: pathlib.Path) -> dict | None:
    """The newest step a program reported (its TRAINING_EVENT lines), from the log's end only."""
    return progress.of_lines(tail_lines(d, TAIL_BYTES))


def tail_lines(d: pathlib.Path, max_bytes: int) -> list[str]:
    """The whole lines among the last ``max_bytes`` of the job's output (``output.log.1`` too when
    ``output.log`` holds fewer), decoded with replacement characters."""
    chunks: list[bytes] = []
    want = max_bytes
    for path in (d / LOG, d / f"{LOG}.1"):
        try:
            with open(path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - want))
                data = fh.read(want)
        except OSError:
            continue
        if size > want:  # the first line read is a part of one: dropped
            data = data.split(b"\n", 1)[1] if b"\n" in data else b""
        chunks.insert(0, data)
        want -= len(data)
        if want <= 0 or size > max_bytes:
            break
    return b"".join(chunks).decode("utf-8", errors="replace").splitlines()


def jobs() -> list[dict]:
    """Every local job (a directory under ``jobs/`` that is not a job's is left out)."""
    root = home() / "jobs"
    if not root.is_dir():
        return []
    return [report(d.name) for d in sorted(root.iterdir()) if objects.name_problem(d.name) is None and d.is_dir() and not d.is_symlink()]


def logs(name: str, *, node: int | None, follow: bool, stop: Callable[[], bool] | None = None) -> Iterator[str]:
    """The job's output (one node's with ``node``), to the end or, with ``follow``, until it ends
    (or ``stop()`` says so: a reader that left, trainctl ui --local); a node the job does not have
    is refused."""
    d = job_dir(name)
    if not d.exists():
        raise LocalError(f"no local job {name} (trainctl list --local)")
    if node is not None:
        nodes = _state(d).get("nodes")
        if node < 0 or (isinstance(nodes, int) and node >= nodes):
            raise LocalError(f"--node {node}: {name} has {nodes} node{'s' if nodes != 1 else ''} (0..{nodes - 1 if isinstance(nodes, int) else '?'})")
    for line in _log_lines(d, follow, stop):
        m = NODE_LINE.match(line)
        if node is None or (m and int(m.group(2)) == node):
            yield line


def _log_lines(d: pathlib.Path, follow: bool, stop: Callable[[], bool] | None = None) -> Iterator[str]:
    """The lines of ``output.log.1`` and ``output.log``; with ``follow`` on into the next file
    when the log is rotated, until the job ends. A line is read to at most 1 MiB at a time."""
    rotated = d / f"{LOG}.1"
    if rotated.exists():
        with open(rotated, errors="replace") as fh:
            yield from (line.rstrip("\n") for line in iter(lambda: fh.readline(2**20), ""))
    try:
        fh = open(d / LOG, errors="replace")  # noqa: SIM115 - replaced when rotated
    except OSError:
        return
    try:
        while True:
            line = fh.readline(2**20)
            if line:
                yield line.rstrip("\n")
                continue
            if not follow:
                return
            try:
                moved = os.stat(d / LOG).st_ino != os.fstat(fh.fileno()).st_ino
            except OSError:
                moved = False
            if moved:  # rotated: what was left in the old file was read above
                fh.close()
                fh = open(d / LOG, errors="replace")  # noqa: SIM115
                continue
            if stop is not None and stop():
                return
            if not _alive(_state(d)):  # what it wrote between the last read and its end, then done
                while rest := fh.readline(2**20):
                    yield rest.rstrip("\n")
                return
            time.sleep(0.5)
    finally:
        fh.close()


def _job_processes(state: dict) -> list[proctree.Proc]:
    """Every live process of the job: the emulator and all that descends from it however it left
    (the job's marker), and whatever lives in the PID namespaces of those."""
    marker = state.get("marker")
    if not isinstance(marker, str) or not marker:  # a job from before markers: its emulator's session
        return proctree.members(sessions=[state["pid"]]) if _alive(state) else []
    marked = proctree.members(marker=(proctree.JOB_MARKER, marker))
    spaces = {p.pidns for p in marked}
    return proctree.members(marker=(proctree.JOB_MARKER, marker), namespaces=spaces)


def delete(name: str) -> bool:
    """Stop every process of the job and remove its directory. The emulator is told first (it
    gives each node SIGTERM and its grace period, then SIGKILL); what is left after the job's grace
    period (and a margin) is SIGKILLed here. True when something was running."""
    import shutil

    d = job_dir(name)
    if not d.exists():
        raise LocalError(f"no local job {name} (trainctl list --local)")
    foreign = sorted(p.name for p in d.iterdir() if p.name not in JOB_FILES)
    if foreign:
        raise LocalError(f"{d} holds {', '.join(foreign[:3])}, which trainctl did not write: left as it is")
    state = _state(d)
    grace = state.get("grace_seconds")
    grace = float(grace) if isinstance(grace, int | float) and not isinstance(grace, bool) else float(grace_seconds({}, STACK))

    def find() -> list[proctree.Proc]:
        return _job_processes(state)

    stopped = False
    if _alive(state):  # the emulator stops its nodes as the kubelet would
        stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + grace + STOP_MARGIN_S
        while _alive(state) and time.monotonic() < deadline:
            time.sleep(0.2)
    # what is left (the emulator gone, or past its time): SIGTERM, the grace period, SIGKILL
    stopped = proctree.stop(find, 0 if stopped else grace) or stopped
    left = proctree.kill(find)
    if left:
        raise LocalError(f"{name}: processes {', '.join(str(p.pid) for p in left[:5])} of the job did not end after SIGKILL; its directory is kept")
    shutil.rmtree(d)
    return stopped


def evidence(name: str):
    """What a local run left, as ``trainctl diagnose`` reads it: each node's lines and exit codes."""
    from trainctl.diagnose import Evidence

    d = job_dir(name)
    if not d.exists():
        raise LocalError(f"no local job {name} (trainctl list --local)")
    lines: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    for line in tail_lines(d, EVIDENCE_BYTES):
        m = NODE_LINE.match(line)
        if m:
            lines.setdefault(f"node {m.group(2)}", []).append(line[m.end():])
        for pod, code in re.findall(r"'([\w.-]+-node-0-\d+)': (\d+)", line) if "exit codes" in line else ():
            codes[pod] = int(code)
    res = result(d) or {}
    trainjob = None
    if res.get("reason") == "DeadlineExceeded" or "deadline" in (res.get("message") or "").lower():
        trainjob = {"metadata": {"name": name}, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": res.get("message", "")}]}}
    return Evidence(trainjob=trainjob, log_lines={k: v[-40:] for k, v in lines.items()}, exit_codes=codes)
