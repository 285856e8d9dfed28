"""The processes of one local cluster: started detached, recorded by pid, stopped by pid.

``state.json`` in the cluster directory lists every process this cluster started (name, pid, the
kernel's start time of that pid, its log). Stopping sends SIGTERM to exactly those pids, and only
while the pid still belongs to the process that was started (same start time), then SIGKILL after a
grace period. Nothing is ever looked up or stopped by name.
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


class ProcessError(Exception):
    """A component that failed, as one line naming it (and the tail of its log)."""


@dataclass
class Proc:
    name: str
    pid: int
    start_time: str
    log: str
    args: list[str]


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def alive(proc: Proc) -> bool:
    start = _start_time(proc.pid)
    if start is None or start != proc.start_time:
        return False
    try:
        state = pathlib.Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def log_tail(path: str | pathlib.Path, lines: int = 8) -> str:
    try:
        text = pathlib.Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join("    " + line[:300] for line in kept) or "(empty log)"


_HANDED_OUT: set[int] = set()  # ports this process has chosen: never chosen twice (two clusters may start before either binds)
_LOWEST_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (and for a bind to port 0)."""
    try:
        low, high = (int(v) for v in pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A free port on 127.0.0.1 for a component to listen on, chosen below the kernel's ephemeral
    range: a port from that range (as a bind to port 0 gives) can be taken by any outgoing
    connection's local end between the choice and the component's own bind, which made a
    controller exit at start ("failed to setup manager") while many clusters talked at once."""
    import random

    low, _ = _ephemeral_range()
    if low - _LOWEST_PORT >= 1000:
        for _ in range(200):
            port = random.randrange(_LOWEST_PORT, low)
            if port not in _HANDED_OUT and not port_in_use(port):
                _HANDED_OUT.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _HANDED_OUT.add(port)
    return port


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when the thread that started it ends


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when its starter ends, even by a signal that skips atexit
    (a test run stopped by a timeout). SIGKILL, not SIGTERM: such a cluster's state is thrown away,
    and on SIGTERM kube-apiserver begins a graceful shutdown that can outlast the etcd killed with
    it (a whole-suite run saw it alive 30 s on). Linux only; elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class Processes:
    """The processes recorded in ``<dir>/state.json``. ``die_with_parent``: for a cluster that
    lives only as long as the process using it (the API-server judge), not one that ``make
    cluster-up`` leaves running for ``make cluster-down``."""

    def __init__(self, directory: pathlib.Path, *, die_with_parent: bool = False):
        self.die_with_parent = die_with_parent
        self.dir = directory
        self.file = directory / "state.json"
        self.procs: list[Proc] = []
        self.info: dict = {}
        if self.file.is_file():
            try:
                data = json.loads(self.file.read_text())
                self.procs = [Proc(**p) for p in data.get("processes", [])]
                self.info = data.get("info", {})
            except (ValueError, TypeError):
                self.procs = []

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"processes": [asdict(p) for p in self.procs], "info": self.info}, indent=1) + "\n")
        tmp.replace(self.file)

    def start(self, name: str, args: list[str], *, env: dict[str, str] | None = None, cwd: pathlib.Path | None = None) -> Proc:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with open(log, "ab") as fh, open(os.devnull, "rb") as devnull:
            try:
                popen = subprocess.Popen(args, stdin=devnull, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
                                         preexec_fn=_die_with_parent if self.die_with_parent else None)
            except OSError as err:
                raise ProcessError(f"{name}: cannot start {args[0]} ({err.strerror})") from None
        start = _start_time(popen.pid) or ""
        proc = Proc(name, popen.pid, start, str(log), args)
        self.procs.append(proc)
        self.save()
        return proc

    def get(self, name: str) -> Proc | None:
        return next((p for p in self.procs if p.name == name), None)

    def dead(self) -> list[Proc]:
        return [p for p in self.procs if not alive(p)]

    def check(self) -> None:
        """Raise naming the first recorded process that is no longer running, with its last log lines."""
        for proc in self.dead():
            raise ProcessError(f"{proc.name} (pid {proc.pid}) exited; its last log lines ({proc.log}):\n{log_tail(proc.log)}")

    def wait(self, name: str, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``ready()``; fail at once, naming ``name``, if its process exits."""
        proc = self.get(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and not alive(proc):
                raise ProcessError(f"{name} exited while starting ({what}); its last log lines ({proc.log}):\n{log_tail(proc.log)}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet (connection refused, 5xx, ...)
                pass
            time.sleep(0.25)
        tail = f"; its last log lines ({proc.log}):\n{log_tail(proc.log)}" if proc else ""
        raise ProcessError(f"{name} not ready after {timeout:.0f} s ({what}){tail}")

    def stop_all(self, grace: float = 10.0) -> list[str]:
        """SIGTERM every recorded process that is still ours, newest first; SIGKILL after ``grace``."""
        stopped = []
        for proc in reversed(self.procs):
            if alive(proc):
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                    stopped.append(f"{proc.name}({proc.pid})")
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in self.procs):
            time.sleep(0.1)
        for proc in self.procs:
            if alive(proc):
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in self.procs):
            time.sleep(0.1)
        self.procs = [p for p in self.procs if alive(p)]
        self.save()
        return stopped
