"""trainctl's local mode: a job runs on this machine through the emulator (``tools/emulate.py``),
from the same ConfigMap and TrainJob the cluster path creates, in the background.

State lives in one directory, ``$TRAINCTL_HOME`` (default ``$XDG_STATE_HOME/trainctl``, else
the user's state directory ``.local/state/trainctl`` under ``$HOME``): ``jobs/<name>/`` holds ``objects.yaml`` (what was submitted),
``job.json`` (pid, start time, the command), ``output.log`` (every node's lines, prefixed with
node and rank), ``result.json`` (the emulator's summary once it ends) and ``work/`` (the job's
volumes: ``work/volumes/checkpoints`` is its ``/mnt/checkpoints``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import yaml

from trainctl import progress

HOME_ENV = "TRAINCTL_HOME"
PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent  # the emulator is the project's tools/emulate.py
NODE_LINE = re.compile(r"^\[attempt (\d+) node (\d+)(?: ranks? [\d-]+)?\] ")


class LocalError(Exception):
    """A local-mode request that cannot be done (one line for the user)."""


def home() -> pathlib.Path:
    if os.environ.get(HOME_ENV):
        return pathlib.Path(os.environ[HOME_ENV])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return pathlib.Path(state) / "trainctl"


def job_dir(name: str) -> pathlib.Path:
    return home() / "jobs" / name


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat): a pid the system reused is not ours."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def submit(cm: dict, trainjob: dict, *, stack: str = "dev", timeout_s: float = 3600) -> dict:
    """Start the emulator on the objects in the background; refuse a name that exists."""
    name = trainjob["metadata"]["name"]
    d = job_dir(name)
    if d.exists():
        raise LocalError(f"a local job {name} exists already (trainctl delete --local {name}, or pass --name)")
    d.mkdir(parents=True)
    (d / "objects.yaml").write_text(yaml.safe_dump_all([cm, trainjob], sort_keys=False))
    command = [
        sys.executable, "-m", "tools.emulate", "--stack", stack, "--trainjob", str(d / "objects.yaml"), "--work-dir", str(d / "work"),
        "--timeout", str(timeout_s), "--result-file", str(d / "result.json"),
    ]
    with open(d / "output.log", "wb") as log:
        proc = subprocess.Popen(command, cwd=PROJECT_DIR, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    state = {"name": name, "pid": proc.pid, "started": _start_time(proc.pid), "submitted_at": time.time(), "nodes": trainjob["spec"]["trainer"].get("numNodes"), "command": command}
    (d / "job.json").write_text(json.dumps(state, indent=1))
    return state


def _state(d: pathlib.Path) -> dict:
    try:
        return json.loads((d / "job.json").read_text())
    except (OSError, ValueError):
        return {"name": d.name}


def _alive(state: dict) -> bool:
    pid = state.get("pid")
    return bool(pid) and _start_time(pid) is not None and _start_time(pid) == state.get("started")


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
    return out


def last_progress(d: pathlib.Path) -> dict | None:
    """The newest step a program reported (its TRAINING_EVENT lines)."""
    return progress.of_lines(_lines(d))


def _lines(d: pathlib.Path) -> Iterator[str]:
    try:
        with open(d / "output.log", errors="replace") as fh:
            yield from (line.rstrip("\n") for line in fh)
    except OSError:
        return


def jobs() -> list[dict]:
    root = home() / "jobs"
    return [report(d.name) for d in sorted(root.iterdir())] if root.is_dir() else []


def logs(name: str, *, node: int | None, follow: bool) -> Iterator[str]:
    """The job's output (one node's with ``node``), to the end or, with ``follow``, until it ends."""
    d = job_dir(name)
    if not d.exists():
        raise LocalError(f"no local job {name} (trainctl list --local)")
    with open(d / "output.log", errors="replace") as fh:
        while True:
            line = fh.readline()
            if line:
                m = NODE_LINE.match(line)
                if node is None or (m and int(m.group(2)) == node):
                    yield line.rstrip("\n")
                continue
            if not follow or not _alive(_state(d)):
                return
            time.sleep(0.5)


def delete(name: str) -> bool:
    """Stop the job's emulator (its whole process group: every node) and remove its directory."""
    import shutil

    d = job_dir(name)
    if not d.exists():
        raise LocalError(f"no local job {name} (trainctl list --local)")
    state = _state(d)
    stopped = False
    if _alive(state):
        os.killpg(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(state) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(state):
            os.killpg(state["pid"], signal.SIGKILL)
        stopped = True
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
    for line in _lines(d):
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
