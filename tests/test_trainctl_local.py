"""trainctl's local mode and the emulator's fidelity: user code run on this machine from the
objects the cluster path creates, with the platform's failure policy, its volumes at their real
paths, preemption that loses nothing, and one line for an unreachable cluster."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
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


# --- round 4: a NAME is a name, nothing of a job is left, output within bounds ---------------------


@pytest.mark.parametrize("name", ["../../outside", "<absolute>", ".", "..", "jobs/../x", "UPPER", "a" * 64, ""])
@pytest.mark.parametrize("cmd", ["delete", "status", "logs", "diagnose"])
def test_a_local_name_is_a_job_name_and_never_leaves_the_state_dir(home, tmp_path, capsys, cmd, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (home / "jobs").mkdir(parents=True)
    # an absolute path of the test's own (never a system directory: the code before this fix rmtree'd whatever it was given)
    name = str(outside) if name == "<absolute>" else name
    rc, out, err = run(capsys, cmd, "--local", name)
    assert rc == 1 and out == "" and err.count("\n") == 1 and "is not a local job's name" in err, err
    assert (outside / "keep.txt").read_text() == "mine" and (home / "jobs").is_dir()


def test_a_job_dir_that_is_a_symlink_or_holds_foreign_files_is_left_alone(home, tmp_path, capsys):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "data").write_text("mine")
    (home / "jobs").mkdir(parents=True)
    (home / "jobs" / "linked").symlink_to(target)
    rc, _, err = run(capsys, "delete", "--local", "linked")
    assert rc == 1 and err.count("\n") == 1 and "symbolic link" in err
    assert (target / "data").read_text() == "mine"
    (home / "jobs" / "notmine").mkdir()
    (home / "jobs" / "notmine" / "thesis.tex").write_text("mine")
    rc, _, err = run(capsys, "delete", "--local", "notmine")
    assert rc == 1 and err.count("\n") == 1 and "thesis.tex" in err and "left as it is" in err
    assert (home / "jobs" / "notmine" / "thesis.tex").exists()


def test_a_jobs_dir_that_is_a_symlink_is_not_followed(home, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "victim").mkdir(parents=True)
    home.mkdir()
    (home / "jobs").symlink_to(elsewhere)
    rc, _, err = run(capsys, "delete", "--local", "victim")
    assert rc == 1 and "symbolic link" in err and (elsewhere / "victim").is_dir()


def fake_job(home: pathlib.Path, name: str, nodes: int, log: bytes) -> pathlib.Path:
    d = home / "jobs" / name
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"name": name, "pid": 0, "nodes": nodes, "submitted_at": time.time()}))
    (d / "output.log").write_bytes(log)
    (d / "result.json").write_text(json.dumps({"status": "Complete", "restarts": 0}))
    return d


def test_logs_of_a_node_the_job_does_not_have_is_one_line(home, capsys):
    fake_job(home, "one", 1, b"[attempt 0 node 0 rank 0] hello\n")
    rc, out, err = run(capsys, "logs", "--local", "one", "--node", "7")
    assert rc == 1 and out == "" and err.count("\n") == 1 and "--node 7: one has 1 node (0..0)" in err
    rc, out, _ = run(capsys, "logs", "--local", "one", "--node", "0")
    assert rc == 0 and "hello" in out


def _rchar() -> int:
    return int(next(line.split()[1] for line in open("/proc/self/io") if line.startswith("rchar:")))


def test_list_and_status_read_only_the_end_of_a_large_log(home, capsys):
    d = fake_job(home, "big", 1, b"")
    step = b'[attempt 0 node 0 rank 0] TRAINING_EVENT {"event": "step", "step": 5, "total_steps": 9}\n'
    with open(d / "output.log", "wb") as fh:
        fh.truncate(256 * 1024 * 1024)  # 256 MiB (sparse: no disk used) before the last lines
        fh.seek(0, 2)
        fh.write(b"\n" + step)
    before = _rchar()
    rc, out, err = run(capsys, "list", "--local", "-o", "json")
    rc2, out2, _ = run(capsys, "status", "--local", "big", "-o", "json")
    read = _rchar() - before
    assert rc == 0 and rc2 == 0, err
    assert json.loads(out)[0]["progress"]["step"] == 5 and json.loads(out2)["progress"]["step"] == 5
    assert read < 16 * 1024 * 1024, f"read {read} bytes of a 256 MiB log"


def test_output_that_is_not_utf8_or_has_no_newline_is_relayed_within_bounds():
    """A pod that prints bytes that are not UTF-8 and 1 MiB with no newline: every line comes
    through (replacement characters, lines cut at the cap), the pod is not blocked, and the line
    after them arrives."""
    from tools import emulator_output, emulator_pods

    script = "import sys; w = sys.stdout.buffer.write; w(b'bad \\xff\\xfe bytes\\n'); w(b'x' * (1 << 20)); w(b'\\nafter\\n')"
    result = emulator_pods.run_pods([([sys.executable, "-c", script], {"PATH": "/usr/bin:/bin"})], ["j-node-0-0"], "node", timeout_s=60, quiet=True)
    lines = result.tails[0]
    assert not result.failed and not result.timed_out
    assert lines[0] == "bad \ufffd\ufffd bytes" and lines[-1] == "after"
    assert all(len(line) <= emulator_output.MAX_LINE_BYTES + 80 for line in lines)
    assert sum(1 for line in lines if line.startswith("x")) == (1 << 20) // emulator_output.MAX_LINE_BYTES


def test_a_line_that_never_ends_holds_no_more_than_the_cap():
    from tools.emulator_output import read_lines

    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, b"y" * (8 << 20)), os.close(w)), daemon=True)
    writer.start()
    sizes = [len(line) for line in read_lines(r, max_line=4096)]
    os.close(r)
    assert sum(1 for s in sizes if s > 4096 + 80) == 0 and len(sizes) == (8 << 20) // 4096


def test_the_log_is_rotated_at_its_cap_with_a_line_that_says_so(tmp_path):
    from tools.emulator_output import CappedLog

    log = CappedLog(tmp_path / "output.log", max_bytes=1000)
    for i in range(60):
        log.write(f"line {i:03d} " + "." * 80 + "\n")
    log.close()
    current, previous = (tmp_path / "output.log").read_text(), (tmp_path / "output.log.1").read_text()
    assert current.startswith("emulate: output.log reached its cap of 1000 bytes") and "output.log.1" in current.splitlines()[0]
    assert os.path.getsize(tmp_path / "output.log") <= 1000 + 200 and os.path.getsize(tmp_path / "output.log.1") <= 1000 + 200
    assert "line 059" in current and "line" in previous and "line 000" not in current + previous  # the oldest dropped


LEAVES_CHILDREN = """import os, pathlib, signal, subprocess, sys, time
d = pathlib.Path(os.environ["PIDS_DIR"])
d.mkdir(parents=True, exist_ok=True)
bg = subprocess.Popen(["sleep", "1000"])
ss = subprocess.Popen(["setsid", "sleep", "1001"])
(d / f"rank{os.environ['RANK']}").write_text(f"{os.getpid()} {bg.pid} {ss.pid}")
print("children started", flush=True)
if os.environ.get("IGNORE_SIGTERM"):
    signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
if os.environ.get("EXIT_AT_ONCE"):
    sys.exit(0)
time.sleep(1000)
"""


def _marked(marker: str) -> list[int]:
    """Processes whose environment carries ``marker`` (the test's own, inherited by the job)."""
    from trainctl import proctree

    return [p.pid for p in proctree.members(marker=("H7_TEST_MARK", marker))]


def _gone(marker: str, timeout: float = 15) -> list[str]:
    """The command lines of the job's processes still there after ``timeout`` (the emulator may be
    a moment past writing its result)."""
    deadline = time.monotonic() + timeout
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200] for pid in _marked(marker)]


def _marked_sleeps(marker: str) -> list[str]:
    """The children of the test's script still running (seen from here, whatever namespace they are in)."""
    out = []
    for pid in _marked(marker):
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if cmd.startswith("sleep "):
            out.append(cmd)
    return sorted(out)


@pytest.mark.parametrize("namespaces", [True, False], ids=["pid-namespace", "marker-only"])
def test_a_pod_leaves_no_process_behind(namespaces, tmp_path, monkeypatch):
    """A pod whose script exits 0 leaving a background and a setsid child ends, and so do they
    (with a PID namespace per pod, and where the machine has none, by the pod's marker)."""
    from tools import emulator_mounts, emulator_pods

    if namespaces and emulator_mounts.in_pod_namespaces(["true"], {}) is None:
        pytest.skip("no PID namespaces on this machine")
    mark = f"m{time.monotonic_ns()}"
    script = tmp_path / "leave.py"
    script.write_text(LEAVES_CHILDREN)
    env = {"PATH": os.environ["PATH"], "PIDS_DIR": str(tmp_path / "pids"), "RANK": "0", "EXIT_AT_ONCE": "1", "H7_TEST_MARK": mark}
    command = [sys.executable, str(script)]
    if namespaces:
        command = emulator_mounts.in_pod_namespaces(command, {}) or command
    started = time.monotonic()
    result = emulator_pods.run_pods([(command, env)], ["j-node-0-0"], "node", timeout_s=60, quiet=True)
    assert result.exit_codes == {0: 0} and not result.failed and time.monotonic() - started < 30
    assert (tmp_path / "pids" / "rank0").exists()  # it ran and started its children
    assert _marked(mark) == []


@pytest.mark.slow
def test_delete_stops_every_process_of_the_job(home, tmp_path, capsys, monkeypatch):
    """Two nodes, each worker with a background and a setsid child (torchrun starts the workers in
    sessions of their own): delete leaves no process of the job."""
    mark = f"m{time.monotonic_ns()}"
    monkeypatch.setenv("H7_TEST_MARK", mark)
    monkeypatch.setenv("PIDS_DIR", str(tmp_path / "pids"))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(LEAVES_CHILDREN)
    rc, _, err = run(capsys, "submit", "--local", "--nodes", "2", "--name", "tree", str(proj), "--", "python", "train.py")
    assert rc == 0, err
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "pids").glob("rank*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)
    assert _marked_sleeps(mark) == ["sleep 1000", "sleep 1000", "sleep 1001", "sleep 1001"]
    rc, out, err = run(capsys, "delete", "--local", "tree")
    assert rc == 0 and "stopped and deleted" in out, err
    assert _gone(mark, timeout=0) == []  # workers, their children, torchrun, the launchers, the emulator
    assert not local.job_dir("tree").exists()


def test_a_stopped_emulator_gives_its_pods_their_grace_period_then_kills_all(tmp_path, monkeypatch):
    """The emulator told to stop (trainctl delete): SIGTERM to every process of every pod, the pod's
    grace period, SIGKILL; a pod that leaves at SIGTERM is not waited for; nothing is left."""
    from tools import emulator_mounts, emulator_pods

    mark = f"m{time.monotonic_ns()}"
    script = tmp_path / "leave.py"
    script.write_text(LEAVES_CHILDREN)
    base = {"PATH": os.environ["PATH"], "PIDS_DIR": str(tmp_path / "pids"), "H7_TEST_MARK": mark, "TRAINING_TERMINATION_GRACE_S": "3"}
    stubborn = emulator_mounts.in_pod_namespaces([sys.executable, str(script)], {}) or [sys.executable, str(script)]
    polite = [sys.executable, str(script)]  # no namespace: found by its marker and session
    pods = [(stubborn, {**base, "RANK": "0", "IGNORE_SIGTERM": "1"}), (polite, {**base, "RANK": "1"})]
    threading.Timer(3, emulator_pods.STOP.set).start()
    started = time.monotonic()
    try:
        with pytest.raises(SystemExit) as stopped:
            emulator_pods.run_pods(pods, ["j-node-0-0", "j-node-0-1"], "node", timeout_s=60, quiet=True)
    finally:
        emulator_pods.STOP.clear()
    took = time.monotonic() - started
    assert stopped.value.code == 143
    assert 3 + 3 <= took < 3 + 3 + 8, took  # the stop came at 3 s; the stubborn pod had its 3 s of grace
    assert _gone(mark, timeout=0) == []


def test_trainctl_stops_leftovers_with_sigterm_grace_then_sigkill(tmp_path):
    from trainctl import proctree

    mark = f"m{time.monotonic_ns()}"
    env = {**os.environ, "H7_TEST_MARK": mark}
    ignores = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"], env=env, stdout=subprocess.PIPE, start_new_session=True)
    leaves = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    assert ignores.stdout is not None and ignores.stdout.readline().strip() == b"ready"
    started = time.monotonic()
    assert proctree.stop(lambda: proctree.members(marker=("H7_TEST_MARK", mark)), 2)
    took = time.monotonic() - started
    assert leaves.wait(5) == -signal.SIGTERM and ignores.wait(5) == -signal.SIGKILL
    assert 2 <= took < 8, took


@pytest.mark.slow
def test_a_script_that_exits_leaving_children_completes_and_leaves_none(home, tmp_path, capsys, monkeypatch):
    mark = f"m{time.monotonic_ns()}"
    monkeypatch.setenv("H7_TEST_MARK", mark)
    monkeypatch.setenv("PIDS_DIR", str(tmp_path / "pids"))
    monkeypatch.setenv("EXIT_AT_ONCE", "1")
    r = submit_and_wait(tmp_path, capsys, "leaver", LEAVES_CHILDREN)
    assert r["phase"] == "Complete", r
    assert len(list((tmp_path / "pids").glob("rank*"))) == 2 and _gone(mark) == []


@pytest.mark.slow
def test_output_that_is_not_utf8_reaches_the_log_and_the_job_completes(home, tmp_path, capsys):
    script = "import sys\nsys.stdout.buffer.write(b'bad \\xff bytes\\n' + b'z' * 200000)\nsys.stdout.flush()\nprint('\\nafter', flush=True)\n"
    r = submit_and_wait(tmp_path, capsys, "bytes", script)
    assert r["phase"] == "Complete", r
    text = "\n".join(local.logs("bytes", node=0, follow=False))
    assert "bad \ufffd bytes" in text and "after" in text
