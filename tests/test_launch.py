"""launch.py keeps non-retryable worker exit codes visible through torchrun's exit code 1."""

import subprocess
import sys

from workloads.builders.trainjobs import PROGRAMS_DIR

LAUNCH = str(PROGRAMS_DIR / "launch.py")


def run(child_code: str) -> int:
    return subprocess.run([sys.executable, LAUNCH, sys.executable, "-c", child_code], capture_output=True, text=True, timeout=60).returncode


def test_success_and_plain_failures_pass_through():
    assert run("pass") == 0
    assert run("raise SystemExit(1)") == 1


def test_a_recorded_non_retryable_code_replaces_the_launchers_exit_code():
    # the child stands in for torchrun: a worker recorded 3, the launcher itself exits 1
    child = "import os; open(os.environ['TRAINING_EXIT_CODE_FILE'], 'a').write('3\\n'); raise SystemExit(1)"
    assert run(child) == 3


def test_recorded_retryable_codes_are_ignored():
    child = "import os; open(os.environ['TRAINING_EXIT_CODE_FILE'], 'a').write('1\\n'); raise SystemExit(1)"
    assert run(child) == 1


def test_trainlib_records_usage_errors(tmp_path):
    exit_file = tmp_path / "codes"
    p = subprocess.run(
        [sys.executable, str(PROGRAMS_DIR / "ddp_mnist.py"), "--epochs", "0"],
        env={"TRAINING_EXIT_CODE_FILE": str(exit_file), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2
    assert exit_file.read_text().split() == ["2"]
