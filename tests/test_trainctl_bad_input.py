"""trainctl's bad input, round 4: each class refused with one line naming the flag, exit 2, nothing
created or started, no traceback, and no secret printed back."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from trainctl import cli, code, local, objects, secrets

ROOT = pathlib.Path(__file__).resolve().parent.parent
NS = "vision"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def proj(tmp_path) -> pathlib.Path:
    d = tmp_path / "proj"
    d.mkdir()
    (d / "train.py").write_text("print('training')\n")
    return d


@pytest.fixture
def home(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def nothing_starts(monkeypatch):
    """Any attempt of local mode to start a process fails the test."""
    def popen(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0]!r}")
    monkeypatch.setattr(local.subprocess, "Popen", popen)


def one_line(rc: int, out: str, err: str, expect: str, *, code_: int = 2) -> None:
    assert rc == code_ and out == "", (rc, out, err)
    assert err.count("\n") == 1 and err.startswith("trainctl: error: ") and expect in err, err
    assert "Traceback" not in err


# --- secrets in the command ----------------------------------------------------------------------

TOKENS = {
    "hf": "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN",
    "gh": "ghp_" + "Z" * 36,
    "wandb": "0123456789abcdef" * 2 + "01234567",
    "password": "hunter2",
}


@pytest.mark.parametrize(("argv", "secret"), [
    (["python", "train.py", "--hf-token", TOKENS["hf"]], TOKENS["hf"]),
    (["python", "train.py", f"--api-key={TOKENS['gh']}"], TOKENS["gh"]),
    (["python", "train.py", "--wandb-key", TOKENS["wandb"]], TOKENS["wandb"]),
    (["python", "train.py", "--password", TOKENS["password"]], TOKENS["password"]),
    (["python", "train.py", TOKENS["gh"]], TOKENS["gh"]),  # its shape says it
    (["python", "train.py", "--endpoint", "https://user:s3cr3tpass@host.example/x"], "s3cr3tpass"),
])
@pytest.mark.parametrize("mode", ["--dry-run", "--local"])
def test_a_secret_in_the_command_is_refused_and_never_printed(home, proj, capsys, nothing_starts, argv, secret, mode):
    args = ["submit", mode, "--nodes", "1", *(["--namespace", NS] if mode == "--dry-run" else []), str(proj), "--", *argv]
    rc, out, err = run(capsys, *args)
    one_line(rc, out, err, "looks like a secret")
    assert secret not in err and secret not in out
    assert "Secret" in err  # the hint: a secret reference instead
    assert not home.exists()  # nothing written (local state included)


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--pad-token", "<pad>", "--eos-token", "</s>"],
    ["python", "train.py", "--hf-token", "$HF_TOKEN"],  # a reference to the pod's environment
    ["python", "train.py", "--revision", "0123456789abcdef0123456789abcdef01234567"],  # a git commit
    ["python", "train.py", "--max-tokens", "4096", "--lr", "3e-4"],
])
def test_ordinary_arguments_are_not_taken_for_secrets(argv):
    assert secrets.command_problems(argv) == []


# --- flags checked in local mode too ---------------------------------------------------------------


@pytest.mark.parametrize(("args", "expect"), [
    (["--priority", "urgent"], "--priority 'urgent': allowed: low, normal, high"),
    (["--priority", "high", "--trainer-version", "v2.1.0"], "--priority: Trainer v2.1.0 jobs do not go through Kueue"),
    (["--efa-zone", "not a zone"], "--efa-zone 'not a zone': allowed: an AZ name"),
    (["--efa-zone", "us-west-2a", "--instance-type", "g5.xlarge"], "--efa-zone: instance type g5.xlarge has no EFA"),
])
@pytest.mark.parametrize("mode", ["--dry-run", "--local"])
def test_priority_and_efa_are_checked_in_every_mode(home, proj, capsys, nothing_starts, args, expect, mode):
    argv = ["submit", mode, "--nodes", "1", *args, *(["--namespace", NS] if mode == "--dry-run" else []), str(proj), "--", "python", "train.py"]
    rc, out, err = run(capsys, *argv)
    one_line(rc, out, err, expect)
    assert not home.exists()


def test_a_priority_reaches_the_local_jobs_objects(home, proj, capsys, nothing_starts):
    rc, out, err = run(capsys, "submit", "--local", "--dry-run", "--nodes", "1", "--priority", "high", "-o", "json", str(proj), "--", "python", "train.py")
    assert rc == 0, err
    trainjob = json.loads(out)["items"][1]
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"


def test_local_dry_run_prints_the_objects_and_starts_nothing(home, proj, capsys, nothing_starts):
    rc, out, err = run(capsys, "submit", "--local", "--dry-run", "--nodes", "2", "--name", "dry", str(proj), "--", "python", "train.py")
    assert rc == 0, err
    assert "kind: TrainJob" in out and "name: dry" in out
    assert "nothing started" in err
    assert not home.exists()


# --- the code dir ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["--dry-run", "--local"])
@pytest.mark.parametrize("shipped", ["_platform_launch.py", "_platform_status.py"])
def test_a_directory_named_like_a_shipped_file_is_refused(home, proj, capsys, nothing_starts, mode, shipped):
    (proj / shipped).mkdir()
    (proj / shipped / "helper.py").write_text("x = 1\n")
    argv = ["submit", mode, "--nodes", "1", *(["--namespace", NS] if mode == "--dry-run" else []), str(proj), "--", "python", "train.py"]
    rc, out, err = run(capsys, *argv)
    one_line(rc, out, err, f"a directory named '{shipped}'")


def test_many_small_files_are_refused_for_the_objects_size_not_only_their_data(tmp_path, capsys):
    """30,000 one-byte files in a sub-directory: 30 kB of data, far under the ConfigMap's 1 MiB, but
    a key each in the ConfigMap and a {key, path} entry each in the TrainJob's volume make a TrainJob
    larger than etcd's 1.5 MiB request limit."""
    d = tmp_path / "many"
    (d / "samples").mkdir(parents=True)
    (d / "train.py").write_text("print(1)\n")
    for i in range(30_000):
        (d / "samples" / f"sample_{i:06d}.txt").write_text("x")
    rc, out, err = run(capsys, "submit", "--dry-run", "--namespace", NS, "--nodes", "1", str(d), "--", "python", "train.py")
    one_line(rc, out, err, "the API server can store in one object")
    assert "a TrainJob of about" in err and "1.5 MiB (1572864 bytes)" in err


def test_the_stored_size_counts_base64_keys_and_the_trainjobs_items():
    text = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a.txt": "x" * 300}}
    binary = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "binaryData": {"a.bin": "eA==" * 100}}  # 300 bytes as base64
    assert code.stored_size(binary) > code.stored_size(text)  # base64: 4 bytes for 3
    keys = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {f"k{i:05d}": "" for i in range(1000)}}
    assert code.stored_size(keys) >= 1000 * len('"k00000":"",')  # every key counts
    items = [{"key": f"d__f{i:06d}.py", "path": f"d/f{i:06d}.py"} for i in range(40_000)]
    trainjob = {"kind": "TrainJob", "spec": {"volumes": [{"configMap": {"items": items}}]}}
    assert code.object_problems("proj", 40_000, [trainjob]) and "a TrainJob of about" in code.object_problems("proj", 40_000, [trainjob])[0]


# --- local mode's own bounds ------------------------------------------------------------------------


def test_local_nodes_are_capped_by_a_maximum_and_the_machines_memory(home, proj, capsys, nothing_starts, monkeypatch):
    rc, out, err = run(capsys, "submit", "--local", "--nodes", str(local.MAX_LOCAL_NODES + 1), str(proj), "--", "python", "train.py")
    one_line(rc, out, err, f"a local job runs at most {local.MAX_LOCAL_NODES} nodes")
    monkeypatch.setattr(local, "available_memory_bytes", lambda: 3 * local.node_memory_bytes(1) + 1)
    rc, out, err = run(capsys, "submit", "--local", "--nodes", "4", str(proj), "--", "python", "train.py")
    one_line(rc, out, err, "room for 3 local nodes of ~700 MB")
    rc, out, err = run(capsys, "submit", "--local", "--nodes", "2", "--gpus-per-node", "4", "--instance-type", "g5.12xlarge", str(proj), "--", "python", "train.py")
    one_line(rc, out, err, "room for 1 local node of ~1750 MB")  # a worker more a node: ~350 MB more
    rc, out, err = run(capsys, "submit", "--local", "--nodes", "2", "--gpus-per-node", "1", "--name", "fits", "--dry-run", str(proj), "--", "python", "train.py")
    assert rc == 0, err
    assert not home.exists()


def test_every_problem_of_a_local_submit_at_once(home, proj, capsys, nothing_starts):
    rc, out, err = run(capsys, "submit", "--local", "--nodes", "99", "--priority", "urgent", str(proj), "--", "python", "train.py", "--token", TOKENS["hf"])
    assert rc == 2 and out == "" and err.count("\n") == 3, err
    assert TOKENS["hf"] not in err


# --- usage -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("since", "expect"), [
    ("999999d", "reaches back before 1970-01-01"),
    ("99999999999999999999999h", "allowed: a duration"),
    ("2999-01-01", "in the future"),
    ("0001-01-01", "before 1970-01-01"),
    ("0d", "a period of no length"),
    ("0m", "a period of no length"),
])
def test_usage_since_out_of_bounds_is_one_line(capsys, since, expect):
    rc, out, err = run(capsys, "usage", "--since", since)
    one_line(rc, out, err, expect)


def test_usage_since_out_of_bounds_is_one_line_from_the_console(tmp_path):
    done = subprocess.run([sys.executable, "-m", "trainctl.cli", "usage", "--since", "999999d"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_request_lists_every_problem_without_raising():
    req = objects.Request(namespace="Bad_NS", nodes=1, command=[], priority="x", trainer_version="v2.1.0")
    found = objects.problems(req)
    assert any("--namespace" in p for p in found) and any("--priority 'x'" in p for p in found) and any("no command" in p for p in found)


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "t.py", "--pass", "hunter2x"],
        ["python", "t.py", "--key", "abcdefgh1234"],
        ["curl", "--header", "Authorization: Bearer abcdefghijkl123"],
        ["sh", "-c", 'curl -H "Authorization: Basic dXNlcjpwYXNzd29yZA==" https://x'],
    ],
)
def test_more_credential_shapes_in_a_command_are_refused(argv):
    found = secrets.command_problems(argv)
    assert len(found) == 1 and argv[-1] not in found[0] and "abcdefgh" not in found[0] and "hunter2x" not in found[0]
