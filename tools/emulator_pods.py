"""The pods of one emulated attempt: started together, their output relayed a whole line at a time,
stopped together on the first failure, and stopped as the kubelet stops them: SIGTERM, the pod's
grace period, then SIGKILL of every process of the pod.

Every process of a pod is found (``trainctl/proctree.py``): a node runs as PID 1 of a PID namespace
of its own where the machine allows it (``tools/emulator_mounts.py``), and each pod carries a
marker in its environment and a session of its own, so a worker in a session of its own
(torchrun's), a ``setsid`` child or a background child of a script that exited 0 ends with its
pod; nothing of an attempt is left when it ends.

The emulator itself stopped (SIGTERM: ``trainctl delete --local``, a terminal's ``kill``) stops its
pods so, gives each its grace period, and then exits with 143 without a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from k8s.builders.runtimes import GRACE_ENV  # the pod's terminationGracePeriodSeconds, in its env
from tools.emulator_objects import EVENT, K8S_DEFAULT_GRACE_S, SIGTERM_LINE, Attempt, PodExit
from tools.emulator_output import read_lines
from trainctl import proctree

KEPT_LINES = 400  # of each pod's output, to find them in
STOP = threading.Event()  # set when the emulator is told to stop
RUNNING = threading.Event()  # set while pods run (a stop then waits for their grace periods)
_OUT = threading.Lock()  # one whole line at a time on our stdout


def say(line: str) -> None:
    """One line, written whole (print's text and newline are two writes another thread can split)."""
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _launcher_noise(line: str) -> bool:
    """torch's own log lines (glog/c10 W/I lines, torchrun's warnings): hidden; the programs' are not."""
    return line.startswith(("W1", "I1", "E1", "[W", "[I")) or line.startswith(("WARNING:torch.distributed", "INFO:torch.distributed"))


def container_exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode  # killed by signal N: 128 + N


def request_stop(*_) -> None:
    """The emulator's SIGTERM handler: running pods are stopped with their grace periods by
    :func:`run_pods`; with none running, the emulator exits at once."""
    STOP.set()
    if not RUNNING.is_set():
        raise SystemExit(143)


class Pod:
    """One started pod: its first process and everything that descends from it."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.token = uuid.uuid4().hex
        self.proc = subprocess.Popen(command, env={**env, proctree.POD_MARKER: self.token}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self._ns: str | None = None

    def members(self) -> list[proctree.Proc]:
        alive = self.proc.returncode is None  # not reaped yet: its pid (and session id) is still its own
        if self._ns is None and alive:
            self._ns = proctree.child_pidns(self.proc.pid)
        return proctree.members(marker=(proctree.POD_MARKER, self.token), namespaces=[self._ns] if self._ns else [], sessions=[self.proc.pid] if alive else [])

    def terminate(self) -> None:
        proctree.send(self.members(), signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: the first process (unshare's --kill-child takes its namespace with it, and the
        pod's exit code is 137 as from the kubelet), then whatever of the pod is left."""
        with contextlib.suppress(ProcessLookupError):
            if self.proc.returncode is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        proctree.kill(self.members)


def run_pods(commands: list[tuple[list[str], dict[str, str]]], pod_names: list[str], label: str, timeout_s: float, quiet: bool, ranks: list[str] | None = None) -> Attempt:
    """Start every pod, stop them all on the first failure (a distributed job needs every one).
    Output is relayed a whole line at a time with the pod's node (and rank) in front."""
    result = Attempt()
    lock = threading.Lock()
    pods: list[Pod] = []
    # a node told to stop (SIGTERM) has its pod's grace period to leave, then SIGKILL, as from the kubelet
    graces = [float(env.get(GRACE_ENV) or K8S_DEFAULT_GRACE_S) for _, env in commands]
    terminated_at: dict[int, float] = {}

    def relay(n: int, line: str) -> None:
        if SIGTERM_LINE in line:
            terminated_at.setdefault(n, time.monotonic())
        m = EVENT.match(line)
        if m:
            try:
                ev = json.loads(m.group(1))
            except ValueError:  # a program's own line that only looks like an event
                ev = None
            if isinstance(ev, dict):
                with lock:
                    result.events.append(ev)
        if _launcher_noise(line):
            return
        with lock:
            tail = result.tails.setdefault(n, [])
            tail.append(line)
            del tail[:-KEPT_LINES]
        if not quiet:
            say(f"[{label} {n}{' ' + ranks[n] if ranks else ''}] {line}")

    def pump(n: int) -> None:
        stdout = pods[n].proc.stdout
        assert stdout is not None  # stdout=PIPE
        for line in read_lines(stdout.fileno()):
            relay(n, line)

    readers: list[threading.Thread] = []
    RUNNING.set()
    try:
        for command, env in commands:
            pods.append(Pod(command, env))
        readers = [threading.Thread(target=pump, args=(n,), daemon=True) for n in range(len(pods))]
        for t in readers:
            t.start()
        deadline = time.monotonic() + timeout_s
        while True:
            if STOP.is_set():
                _stop(pods, graces, label)
                raise SystemExit(143)
            codes = {n: p.proc.poll() for n, p in enumerate(pods)}
            failed = {n: c for n, c in codes.items() if c not in (None, 0)}
            if failed or all(c == 0 for c in codes.values()):
                break
            for n in [n for n, at in list(terminated_at.items()) if codes[n] is None and time.monotonic() - at > graces[n]]:  # a snapshot: the readers add
                del terminated_at[n]
                print(f"emulate: {label} {n} did not leave within its grace period ({graces[n]:.0f} s) after SIGTERM: SIGKILL", flush=True)
                pods[n].kill()
            if time.monotonic() > deadline:
                print(f"emulate: {label} timed out after {timeout_s:.0f}s", flush=True)
                result.timed_out = True
                break
            time.sleep(0.1)
        result.failed = [PodExit(pod_names[n], container_exit_code(c)) for n, c in sorted(failed.items())]
    finally:  # like the JobSet: one failed pod fails the attempt; the others are stopped (also on errors here)
        for pod in pods:  # also a pod whose first process ended: nothing of it outlives it
            pod.kill()
        for n, pod in enumerate(pods):
            pod.proc.wait()
            result.exit_codes[n] = container_exit_code(pod.proc.returncode)
        for t in readers:
            t.join(timeout=5)
        for pod, t in zip(pods, readers, strict=False):
            if pod.proc.stdout is not None and not t.is_alive():  # never under a reader that still reads
                pod.proc.stdout.close()
        RUNNING.clear()
    return result


def _stop(pods: list[Pod], graces: list[float], label: str) -> None:
    """SIGTERM to every process of every pod, then SIGKILL to a pod left after its grace period."""
    print(f"emulate: stopping: SIGTERM to every {label}, SIGKILL after its grace period ({max(graces):.0f} s)", flush=True)
    started = time.monotonic()
    left = set(range(len(pods)))
    termed: dict[int, set[int]] = {n: set() for n in left}
    while left:
        for n in sorted(left):
            procs = pods[n].members()
            if not procs:
                left.discard(n)
            elif time.monotonic() - started > graces[n]:
                pods[n].kill()
                left.discard(n)
            else:
                fresh = [p for p in procs if p.pid not in termed[n]]
                proctree.send(fresh, signal.SIGTERM)
                termed[n].update(p.pid for p in fresh)
        time.sleep(0.2)
