"""Container entry point: run the launcher (torchrun) and keep the workers' exit semantics.

torchrun exits 1 whenever a worker fails, which would hide the difference between "retry from
the last checkpoint" and "this can never succeed" from the JobSet failure policy. Workers that
stop for a non-retryable reason (bad arguments: 2, bad config or data: 3), or that saved and left
on SIGTERM (143), record their code in the file named by TRAINING_EXIT_CODE_FILE; this wrapper
exits with it, so the runtime's pod
failure policy fails the job at once instead of burning restarts. SIGTERM/SIGINT are forwarded.

Before the command, a ``requirements.txt`` in the code directory (beside this file) is installed
with pip into a virtual environment of its own on the pod (under TRAINING_DEPS_DIR, an emptyDir:
the image's site-packages belong to root and the pod runs as a user) that sees the image's
packages after its own; its site-packages go first on the command's PYTHONPATH and its bin first
on PATH. pip's cache lives there too. The index comes from the platform (TRAINING_PIP_INDEX_URL,
default PyPI; TRAINING_PIP_EXTRA_INDEX_URLS), the time limit from TRAINING_DEPS_TIMEOUT_S. A
failed install prints one ``TRAINING_DEPS_FAILED dependencies failed to install: <pip's error
line>`` line (also the termination message) and exits 3 when no retry changes it (a resolution
conflict, a permission error: the job fails at once), else 4, retried like any failure (an index
outage passes).

Usage: python3 launch.py torchrun train.py [args...]
       python3 launch.py torchrun --no-python python3 launch.py --worker python3 user.py [args...]
"""

from __future__ import annotations

import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time

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
    return stop_saying(message, message, PREFLIGHT_FAILED)


# --- the code directory's requirements.txt, installed before the job's command ----------------
# pip's options are pip 26.3's (pip/_internal/cli/cmdoptions.py, commands/install.py): --isolated
# ignores PIP_* variables and pip.conf files (the platform's index settings are the ones used).
# pip runs in a virtual environment of its own on the emptyDir that sees the image's site
# directories through a .pth file: what the image has counts as installed (torch is not
# reinstalled), and a requirement that needs another version of an image package installs it in
# the environment and leaves the image's copy, which belongs to root, alone. pip 26.3
# req/req_uninstall.py UninstallPathSet.from_dist: "Not uninstalling ... outside environment"
# when not dist.local; utils/misc.py is_local: inside a virtualenv only paths under sys.prefix
# are local (outside one, everything is, and pip would try to remove the image's copy).
REQUIREMENTS = "requirements.txt"
DEPS_FAILED = 4  # retryable (an index outage passes): the runtime's failure policy fails only on 2 and 3
DEPS_CANNOT_INSTALL = 3  # deterministic (a resolution conflict, a permission error): fails the job at once
DEPS_MARKER = "TRAINING_DEPS_FAILED"  # the one log line trainctl status/diagnose recognise (trainctl/diagnose.py)
DEPS_FAILED_TEXT = "dependencies failed to install"
DEPS_DIR_ENV = "TRAINING_DEPS_DIR"  # an emptyDir on the node's disk: pip's cache and the installed packages
INDEX_URL_ENV = "TRAINING_PIP_INDEX_URL"
EXTRA_INDEX_URLS_ENV = "TRAINING_PIP_EXTRA_INDEX_URLS"  # separated by spaces
DEPS_TIMEOUT_ENV = "TRAINING_DEPS_TIMEOUT_S"
DEFAULT_INDEX_URL = "https://pypi.org/simple"
DEFAULT_DEPS_TIMEOUT_S = 600
IMAGE_SITES_PTH = "training-image-sites.pth"
# pip 26.3's messages for what no retry changes: resolution/resolvelib/factory.py
# ("ResolutionImpossible: for help visit ...", after "Cannot install ... conflicting dependencies")
# and commands/install.py create_os_error_message ("Could not install packages due to an OSError:
# [Errno 13] Permission denied ...").
DETERMINISTIC = ("ResolutionImpossible", "conflicting dependencies", "[Errno 13]")


def pip_command(python: str, requirements: str, cache: str, env: dict) -> list[str]:
    """pip's install of ``requirements`` by ``python`` (the job's environment) with the platform's
    index settings."""
    extra = [a for url in (env.get(EXTRA_INDEX_URLS_ENV) or "").split() for a in ("--extra-index-url", url)]
    return [
        python, "-m", "pip", "install", "--isolated", "--no-input", "--disable-pip-version-check", "--no-warn-script-location", "--progress-bar", "off",
        "--cache-dir", cache, "--index-url", env.get(INDEX_URL_ENV) or DEFAULT_INDEX_URL, *extra, "--requirement", requirements,
    ]


def error_line(output: str) -> tuple[str, bool]:
    """pip's error line worth showing (a conflict's "Cannot install ..." line, else the last
    ``ERROR:`` line, else the last line) and whether a retry cannot change it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    deterministic = any(mark in line for line in errors for mark in DETERMINISTIC)
    conflict = [line for line in errors if "conflicting dependencies" in line]
    return (conflict or errors or lines or ["pip printed nothing"])[-1], deterministic


def image_sites() -> list[str]:
    """The site directories of the Python running the launcher (the image's), also when that
    Python is itself a virtual environment (--system-site-packages would name its base's)."""
    return [p for p in dict.fromkeys([*site.getsitepackages(), *sys.path]) if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


def make_env(root: str) -> tuple[str, list[str]]:
    """A virtual environment under ``root`` (no pip of its own: the image's is on its path) that
    sees the image's packages after its own: (its python, its site directories)."""
    venv = tempfile.mkdtemp(prefix="venv-", dir=root)  # one per process: the emulator's nodes share the volume
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, capture_output=True, text=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    out = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib')); print(sysconfig.get_path('platlib'))"], check=True, capture_output=True, text=True, timeout=60)
    sites = list(dict.fromkeys(out.stdout.split()))
    with open(os.path.join(sites[0], IMAGE_SITES_PTH), "w") as fh:
        fh.write("".join(f"{p}\n" for p in image_sites()))
    return python, sites


def install_requirements(env: dict, code_dir: str) -> tuple[dict | None, str | None, tuple[str, int] | None]:
    """Install ``code_dir/requirements.txt``, if there is one, before the command: (the command's
    env with the environment's packages first on PYTHONPATH and its bin, python included, first on
    PATH, the environment to remove afterwards, None) or (None, None, (pip's error line, the exit
    code: DEPS_CANNOT_INSTALL when no retry changes it, else DEPS_FAILED))."""
    requirements = os.path.join(code_dir, REQUIREMENTS)
    if not os.path.isfile(requirements):
        return env, None, None
    root = env.get(DEPS_DIR_ENV) or tempfile.gettempdir()
    cache = os.path.join(root, "pip-cache")
    try:
        os.makedirs(cache, exist_ok=True)
        python, sites = make_env(root)
    except (OSError, subprocess.SubprocessError) as err:
        detail = ((getattr(err, "stderr", None) or "").strip().splitlines() or [str(err)])[-1]
        return None, None, (f"cannot create the environment in {root}: {detail}", DEPS_CANNOT_INSTALL if any(m in detail for m in DETERMINISTIC) else DEPS_FAILED)
    venv = os.path.dirname(os.path.dirname(python))
    try:
        timeout = int(env.get(DEPS_TIMEOUT_ENV) or DEFAULT_DEPS_TIMEOUT_S)
    except ValueError:
        timeout = DEFAULT_DEPS_TIMEOUT_S
    print(f"installing {REQUIREMENTS} (at most {timeout} s)", file=sys.stderr, flush=True)
    started = time.monotonic()
    pip_env = {**env, "PYTHONNOUSERSITE": "1", "HOME": root}  # no user site; HOME may be / (docs/images.md)
    try:
        done = subprocess.run(pip_command(python, requirements, cache, env), env=pip_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        output, code = done.stdout or "", done.returncode
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        output, code = out + f"\nERROR: pip did not finish within {timeout} s ({DEPS_TIMEOUT_ENV}; trainctl submit --deps-timeout)", -1
    sys.stderr.write(output)
    if code != 0:
        shutil.rmtree(venv, ignore_errors=True)
        line, deterministic = error_line(output)
        return None, None, (line.replace(requirements, REQUIREMENTS), DEPS_CANNOT_INSTALL if deterministic else DEPS_FAILED)
    path = [*sites, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    print(f"installed {REQUIREMENTS} in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return {**env, "PYTHONPATH": os.pathsep.join(path), "PATH": os.pathsep.join([os.path.join(venv, "bin"), env.get("PATH", "")])}, venv, None


RESUME_FROM_ENV = "TRAINING_RESUME_FROM"  # trainctl submit --resume-from: another job's checkpoint directory


def deps_failed(problem: str, code: int = DEPS_FAILED) -> int:
    """The one marker line (also the container's termination message) and the exit code."""
    message = f"{DEPS_FAILED_TEXT}: {problem}"
    return stop_saying(f"{DEPS_MARKER} {message}", message, code)


def stop_saying(line: str, message: str, code: int) -> int:
    """``line`` on stderr and ``message`` as the container's termination message (what the
    pod's status, and so trainctl status, shows); ``code`` to exit with."""
    print(line, file=sys.stderr, flush=True)
    try:
        with open("/dev/termination-log", "w") as fh:
            fh.write(message)
    except OSError:
        pass
    return code


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
    resume = os.environ.get(RESUME_FROM_ENV)
    if resume and not os.path.isdir(resume):  # never starts over silently: the name was wrong
        print(f"{RESUME_FROM_ENV}={resume}: no such directory (no job of that name wrote checkpoints on this volume); check trainctl submit --resume-from", file=sys.stderr, flush=True)
        return 3
    env, prefix, problem = install_requirements(dict(os.environ), os.path.dirname(os.path.abspath(__file__)))
    if env is None:
        return deps_failed(*(problem or ("?", DEPS_FAILED)))
    try:
        return run_command(argv, env)
    finally:
        if prefix:
            shutil.rmtree(prefix, ignore_errors=True)


def run_command(argv: list[str], env: dict) -> int:
    """The job's command (torchrun, or the runtime's worker) with the exit-code file."""
    fd, exit_file = tempfile.mkstemp(prefix="training-exit-")
    os.close(fd)
    env = {**env, EXIT_FILE_ENV: exit_file}
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
