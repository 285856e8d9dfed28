"""Every process of a local job, found however it left its parent, and stopped as a pod is: SIGTERM,
the grace period, then SIGKILL.

A process belongs to a job (or to one emulated pod) when any of these holds, read from ``/proc``:

- it carries the job's marker in its environment (``TRAINCTL_LOCAL_JOB=<token>``, or the pod's
  ``EMULATOR_POD=<token>``): every descendant inherits it, also one started in a session of its
  own (torchrun starts each worker so; ``setsid``), or left behind in the background by a script
  that exited;
- it lives in the pod's PID namespace (``tools/emulator_mounts.py``: each node runs as PID 1 of a
  namespace of its own, as in its container, so nothing of it outlives its first process);
- it is in the session the emulator started the pod in.

This process and its ancestors are never signalled, nor is this process's own namespace taken for
a pod's; a signal the system refuses (another user's process) is passed over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

JOB_MARKER = "TRAINCTL_LOCAL_JOB"  # trainctl submit --local: on the emulator, so on all of the job
POD_MARKER = "EMULATOR_POD"  # the emulator: on each pod's first process, so on all of the pod


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool
    pidns: str  # readlink of /proc/<pid>/ns/pid


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    try:
        text = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - a tiny read
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command name (which may hold spaces and parentheses)
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _ns(pid: int | str, which: str = "pid") -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{which}")
    except OSError:
        return ""


def own_pidns() -> str:
    return _ns("self")


def processes() -> list[Proc]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is None:
            continue
        state, ppid, pgid, sid = st
        out.append(Proc(int(entry), ppid, pgid, sid, state in ("Z", "X"), _ns(entry)))
    return out


def environ_has(pid: int, name: str, value: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read()
    except OSError:
        return False
    return f"\0{name}={value}\0".encode() in b"\0" + env


def _ours() -> set[int]:
    """This process and its ancestors: never signalled."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        st = _stat(pid)
        if st is None:
            break
        pid = st[1]
    return pids


def child_pidns(pid: int) -> str | None:
    """The PID namespace ``pid`` starts its children in (unshare --pid --fork), when it is not ours."""
    ns = _ns(pid, "pid_for_children")
    return ns if ns and ns != own_pidns() else None


def members(*, marker: tuple[str, str] | None = None, namespaces: Iterable[str] = (), sessions: Iterable[int] = ()) -> list[Proc]:
    """The live (not zombie) processes that carry ``marker`` (name, value), live in one of
    ``namespaces`` (never ours) or belong to one of ``sessions``."""
    ours, own_ns = _ours(), own_pidns()
    namespaces = {ns for ns in namespaces if ns and ns != own_ns}
    sessions = {s for s in sessions if s > 1}
    found = []
    for p in processes():
        if p.zombie or p.pid in ours:
            continue
        if p.pidns in namespaces or p.sid in sessions or (marker is not None and environ_has(p.pid, *marker)):
            found.append(p)
    return found


def send(procs: Iterable[Proc], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, sig)


def stop(find: Callable[[], list[Proc]], grace_s: float, *, poll_s: float = 0.2, on_kill: Callable[[list[Proc]], None] | None = None) -> bool:
    """SIGTERM to every process ``find`` returns, up to ``grace_s`` for them to leave (new ones
    that appear meanwhile get SIGTERM too), then SIGKILL to whatever is left, until none is.
    True when something was running."""
    procs = find()
    if not procs:
        return False
    termed: set[int] = set()
    deadline = time.monotonic() + grace_s
    while procs and time.monotonic() < deadline:
        fresh = [p for p in procs if p.pid not in termed]
        send(fresh, signal.SIGTERM)
        termed.update(p.pid for p in fresh)
        time.sleep(poll_s)
        procs = find()
    if procs and on_kill is not None:
        on_kill(procs)
    kill(find)
    return True


def kill(find: Callable[[], list[Proc]], *, timeout_s: float = 10) -> list[Proc]:
    """SIGKILL until ``find`` returns nothing (a fork racing the first round is caught by the
    next); what is left after ``timeout_s`` (a process in uninterruptible sleep) is returned."""
    deadline = time.monotonic() + timeout_s
    procs = find()
    while procs and time.monotonic() < deadline:
        send(procs, signal.SIGKILL)
        time.sleep(0.05)
        procs = find()
    return procs
