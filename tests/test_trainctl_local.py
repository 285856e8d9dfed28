"""trainctl's local mode and the emulator's fidelity: user code run on this machine from the
objects the cluster path creates, with the platform's failure policy, its volumes at their real
paths, preemption that loses nothing, and one line for an unreachable cluster."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from trainctl import cli, local

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def wait_done(name: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = local.report(name)
        if r["phase"] != "Running":
            return r
        time.sleep(0.5)
    raise AssertionError(f"local job {name} still running after {timeout} s")


def submit_and_wait(tmp_path, capsys, name: str, script: str) -> dict:
    """A code directory with ``script`` as train.py, submitted --local on 2 nodes; its end."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(script)
    rc, _, err = run(capsys, "submit", "--local", "--nodes", "2", "--name", name, str(proj), "--", "python", "train.py")
    assert rc == 0, err
    return wait_done(name)


@pytest.fixture
def home(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


EXIT_3 = """import os, sys
print("rank", os.environ["RANK"], "starting", flush=True)
if os.environ["RANK"] == "1":
    print("bad config: column 'text' not found", file=sys.stderr, flush=True)
    sys.exit(3)
import time; time.sleep(3)
"""

WRITES_CHECKPOINTS = """import os, pathlib
d = pathlib.Path("/mnt/checkpoints") / os.environ["TRAINING_JOB_NAME"]
d.mkdir(parents=True, exist_ok=True)
(d / f"rank-{os.environ['RANK']}").write_text("saved")
print("saved to", d, flush=True)
"""


@pytest.mark.slow
def test_a_non_retryable_exit_fails_at_once_and_its_logs_are_readable(home, tmp_path, capsys):
    r = submit_and_wait(tmp_path, capsys, "exits-three", EXIT_3)
    assert r["phase"] == "Failed" and r["restarts"] == 0 and r["reason"] == "FailJobSetFailurePolicyAction"
    assert r["failure"]["exit_code"] == 3 and r["failure"]["where"] == "node 1 (rank 1)"
    assert "bad config: column 'text' not found" in r["failure"]["last_lines"]
    rc, out, err = run(capsys, "status", "--local", "exits-three")
    assert rc == 0 and "exited with code 3" in out and "bad config" in out
    rc, out, _ = run(capsys, "logs", "--local", "exits-three", "--node", "1")
    assert rc == 0 and "bad config: column 'text' not found" in out
    assert all(line.startswith("[attempt 0 node 1 rank 1] ") for line in out.splitlines())
    rc, out, _ = run(capsys, "list", "--local", "-o", "json")
    assert rc == 0 and '"exits-three"' in out
    rc, out, _ = run(capsys, "diagnose", "--local", "exits-three")
    assert rc == 0 and out.startswith("non-retryable exit:") and "exit code 3 (bad config or data)" in out
    rc, out, _ = run(capsys, "delete", "--local", "exits-three")
    assert rc == 0 and not local.job_dir("exits-three").exists()


@pytest.mark.slow
def test_code_writing_mnt_checkpoints_writes_the_jobs_volume(home, tmp_path, capsys):
    host = pathlib.Path("/mnt/checkpoints")
    before = sorted(host.rglob("*")) if host.exists() else None
    r = submit_and_wait(tmp_path, capsys, "writer", WRITES_CHECKPOINTS)
    if r["phase"] != "Complete":
        pytest.fail("".join(local.logs("writer", node=None, follow=False)))
    volume = local.job_dir("writer") / "work" / "volumes" / "checkpoints" / "writer"
    assert sorted(p.name for p in volume.iterdir()) == ["rank-0", "rank-1"]
    assert (sorted(host.rglob("*")) if host.exists() else None) == before  # the host's path untouched


REPORTS_PROGRESS = """import os, json, _platform_status
r = _platform_status.Reporter()  # beside the code, as in the pod; no Trainer here: it sends nothing
for step in (1, 2):
    r.update(step=step, total_steps=2, eta_s=2 - step, metrics={"loss": 1.0 / step})
    if os.environ["RANK"] == "0":
        print("TRAINING_EVENT " + json.dumps({"event": "step", "step": step, "total_steps": 2, "eta_s": 2 - step}), flush=True)
print("enabled", r.enabled, flush=True)
"""


@pytest.mark.slow
def test_user_code_reports_progress_through_the_shipped_reporter(home, tmp_path, capsys):
    r = submit_and_wait(tmp_path, capsys, "reporter", REPORTS_PROGRESS)
    assert r["phase"] == "Complete", "".join(local.logs("reporter", node=None, follow=False))
    assert r["progress"] == {"step": 2, "total_steps": 2, "eta_s": 0, "source": "log"}
    assert "enabled False" in "".join(local.logs("reporter", node=0, follow=False))


def test_delete_of_an_unknown_local_job_is_one_line(home, capsys):
    rc, out, err = run(capsys, "delete", "--local", "nope")
    assert rc == 1 and err.count("\n") == 1 and "no local job nope" in err


def test_list_against_an_unreachable_cluster_is_at_most_three_lines(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: vision}}]\nusers: [{name: u, user: {token: x}}]\n"
    )
    done = subprocess.run([sys.executable, "-m", "trainctl.cli", "list", "--kubeconfig", str(kubeconfig)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1 and 1 <= len(lines) <= 3 and "Traceback" not in done.stderr, lines


@pytest.mark.slow
def test_a_preempted_node_saves_its_step_and_the_run_resumes_from_it():
    """SIGTERM to node 1 after step 7 (as the kubelet on a spot interruption or Kueue preemption):
    every rank saves step 7, the pods exit retryably (143), the JobSet restarts, and the run
    resumes at step 7, not at the last periodic checkpoint (6)."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.emulate", "--stack", "dev", "--job", "ddp", "--preempt-node", "1", "--preempt-at-step", "7", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and "status=Complete" in summary and "resumed_from_step=7" in summary, done.stdout[-3000:]
    assert re.search(r"exit codes \{[^}]*'ddp-mnist-node-0-\d': 143", done.stdout), done.stdout[-3000:]  # retryable: it was stopped (one node or both)


@pytest.mark.slow
def test_a_node_hung_in_a_collective_is_stopped_with_a_reason_and_the_job_restarts():
    """Node 1 stops after step 5, so every node blocks in the next all-reduce; with no step for
    the stall timeout each node stops (exit 124) saying so, and the restarted job completes."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.emulate", "--stack", "dev", "--job", "ddp", "--hang-node", "1", "--hang-at-step", "5", "--stall-timeout", "8", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and "status=Complete" in done.stdout.strip().splitlines()[-1], done.stdout[-3000:]
    assert "no step progress for" in done.stdout and re.search(r"exit codes \{[^}]*: 124", done.stdout)


@pytest.mark.slow
def test_a_full_checkpoint_volume_stops_the_job_once_with_a_clear_message():
    done = subprocess.run(
        [sys.executable, "-m", "tools.emulate", "--stack", "dev", "--job", "ddp", "--fill-volume-at-step", "4", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1 and "status=Failed" in summary and "restarts=0" in summary and "exit_code=3" in summary, done.stdout[-3000:]
    assert "checkpoint volume full while saving step 4" in done.stdout and "basic_ios" not in done.stdout
