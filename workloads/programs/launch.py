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
import shutil
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


PREFLIGHT_ENV = "TRAINING_PREFLIGHT"  # "1" in every GPU runtime (k8s/builders/runtimes.py)
EXPECTED_GPUS_ENV = "TRAINING_EXPECTED_GPUS"  # what the TrainJob requested per node (workloads/builders/trainjobs.py)
EXPECTED_EFA_ENV = "TRAINING_EXPECTED_EFA"
PREFLIGHT_FAILED = 5  # retryable: the restarted job should land on a healthy node


def count_gpus() -> int:
    """GPUs this container sees: ``nvidia-smi -L`` (the driver's own list), else torch's count."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        if out.returncode == 0:
            return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def count_efa(dev: str = "/dev/infiniband") -> int:
    """EFA devices this container got (the EFA device plugin mounts one uverbs device each)."""
    try:
        return sum(1 for name in os.listdir(dev) if name.startswith("uverbs"))
    except OSError:
        return 0


def gpu_health(gpus: int) -> str | None:
    """A short check of every GPU: DCGM's quick diagnostic where the image has dcgmi, else a
    matmul on each GPU compared with the CPU's. None when healthy, else what failed."""
    if gpus == 0:
        return None
    if shutil.which("dcgmi"):
        out = subprocess.run(["dcgmi", "diag", "-r", "1"], capture_output=True, text=True, timeout=600)
        return None if out.returncode == 0 else f"dcgmi diag -r 1 failed: {out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.returncode}"
    try:
        import torch
    except ImportError:  # the TensorFlow image
        return _tf_gpu_health(gpus)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    want = a @ b
    for i in range(gpus):
        try:
            got = (a.to(f"cuda:{i}") @ b.to(f"cuda:{i}")).cpu()
        except Exception as err:  # noqa: BLE001 - a broken GPU raises whatever CUDA raises
            return f"GPU {i}: {type(err).__name__}: {err}"
        if not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
            return f"GPU {i}: a matmul differs from the CPU's"
    return None


def _tf_gpu_health(gpus: int) -> str | None:
    """The matmul check with TensorFlow, where the image has it instead of torch."""
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError:
        return None
    a, b = np.random.rand(512, 512).astype("float32"), np.random.rand(512, 512).astype("float32")
    want = a @ b
    for i in range(gpus):
        try:
            with tf.device(f"/GPU:{i}"):
                got = tf.linalg.matmul(a, b).numpy()
        except Exception as err:  # noqa: BLE001 - a broken GPU raises whatever CUDA raises
            return f"GPU {i}: {type(err).__name__}: {err}"
        if not np.allclose(got, want, rtol=1e-2, atol=1e-2):
            return f"GPU {i}: a matmul differs from the CPU's"
    return None


def preflight(env: dict, *, gpus=count_gpus, efa=count_efa, health=gpu_health) -> str | None:
    """What this node was promised against what it has: None, or why it cannot run the job."""
    expected_gpus, expected_efa = int(env.get(EXPECTED_GPUS_ENV) or 0), int(env.get(EXPECTED_EFA_ENV) or 0)
    found = gpus() if expected_gpus else 0
    if found != expected_gpus:
        return f"{found} GPUs visible, the job requested {expected_gpus}"
    found_efa = efa() if expected_efa else 0
    if found_efa != expected_efa:
        return f"{found_efa} EFA devices, the job's layout needs {expected_efa}"
    return health(found)


def run_preflight(env: dict) -> int | None:
    """The preflight where the runtime asks for it: a failure is one line naming the node (also the
    container's termination message) and a retryable exit."""
    if env.get(PREFLIGHT_ENV) != "1":
        return None
    problem = preflight(env)
    if problem is None:
        return None
    message = f"preflight failed on node {env.get('NODE_NAME', '?')}: {problem}"
    print(message, file=sys.stderr, flush=True)
    try:
        with open("/dev/termination-log", "w") as fh:
            fh.write(message)
    except OSError:
        pass
    return PREFLIGHT_FAILED


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
    failed = run_preflight(dict(os.environ))
    if failed is not None:
        return failed
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
