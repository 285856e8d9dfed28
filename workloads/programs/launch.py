"""Container entry point: run the launcher (torchrun) and keep the workers' exit semantics.

torchrun exits 1 whenever a worker fails, which would hide the difference between "retry from
the last checkpoint" and "this can never succeed" from the JobSet failure policy. Workers that
stop for a non-retryable reason (bad arguments: 2, bad config or data: 3) record their code in
the file named by TRAINING_EXIT_CODE_FILE; this wrapper exits with it, so the runtime's pod
failure policy fails the job at once instead of burning restarts. SIGTERM/SIGINT are forwarded.

Usage: python3 launch.py torchrun train.py [args...]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

EXIT_FILE_ENV = "TRAINING_EXIT_CODE_FILE"
NON_RETRYABLE = (2, 3)


def recorded_exit_code(path: str) -> int | None:
    try:
        with open(path) as fh:
            codes = [int(line) for line in fh if line.strip()]
    except (FileNotFoundError, ValueError):
        return None
    codes = [c for c in codes if c in NON_RETRYABLE]
    return max(codes) if codes else None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: launch.py COMMAND [ARGS...]", file=sys.stderr)
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
