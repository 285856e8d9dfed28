"""Container entry point: run the launcher (torchrun) and keep the workers' exit semantics.

torchrun exits 1 whenever a worker fails, which would hide the difference between "retry from
the last checkpoint" and "this can never succeed" from the JobSet failure policy. Workers that
stop for a non-retryable reason (bad arguments: 2, bad config or data: 3), or that saved and left
on SIGTERM (143), record their code in the file named by TRAINING_EXIT_CODE_FILE; this wrapper
exits with it, so the runtime's pod
failure policy fails the job at once instead of burning restarts. SIGTERM/SIGINT are forwarded.

Usage: python3 launch.py torchrun train.py [args...]
       python3 launch.py torchrun --no-python python3 launch.py --worker python3 user.py [args...]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

EXIT_FILE_ENV = "TRAINING_EXIT_CODE_FILE"
NON_RETRYABLE = (2, 3)
PREEMPTED = 143  # a worker saved and left on SIGTERM (trainlib.exit_preempted): retryable
STALLED = 124  # a worker's watchdog saw no step progress (trainlib.Progress): retryable


def recorded_exit_code(path: str) -> int | None:
    """The code the pod ends with: a non-retryable one any worker recorded, else the preemption's."""
    try:
        with open(path) as fh:
            codes = [int(line) for line in fh if line.strip()]
    except (FileNotFoundError, ValueError):
        return None
    worst = [c for c in codes if c in NON_RETRYABLE]
    if worst:
        return max(worst)
    return next((c for c in (PREEMPTED, STALLED) if c in codes), None)


def worker(argv: list[str]) -> int:
    """``launch.py --worker COMMAND...``: one worker of code that does not record its own exit code
    (a user's script submitted with trainctl): run it, and record a non-retryable exit (2, 3) for
    the pod's launch.py, as the platform's programs do. torchrun runs it with ``--no-python``."""
    child = subprocess.Popen(argv)

    def forward(signum, _frame):
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    code = code if code >= 0 else 128 - code
    path = os.environ.get(EXIT_FILE_ENV)
    if path and code in (*NON_RETRYABLE, PREEMPTED):
        with open(path, "a") as fh:
            fh.write(f"{code}\n")
    return code


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    if not argv:
        print("usage: launch.py COMMAND [ARGS...] | launch.py --worker COMMAND [ARGS...]", file=sys.stderr)
        return 2
    fd, exit_file = tempfile.mkstemp(prefix="training-exit-")
    os.close(fd)
    env = {**os.environ, EXIT_FILE_ENV: exit_file}
    child = subprocess.Popen(argv, env=env)

    def forward(signum, _frame):
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    recorded = recorded_exit_code(exit_file)
    os.unlink(exit_file)
    if code != 0 and recorded is not None:
        return recorded
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
