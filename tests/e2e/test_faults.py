"""The local cluster's bad inputs and faults: one line naming what failed and what to do, no
process left behind, no traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tools.cluster import build, components
from tools.cluster import up as cluster
from tools.cluster.procs import ProcessError, Processes, alive


def _leftovers(d) -> list[str]:
    return [f"{p.name}({p.pid})" for p in Processes(d).procs if alive(p)]


def test_a_port_in_use_is_one_line_naming_it_and_nothing_is_left_running(tmp_path, monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    real = cluster.free_port
    calls = iter(range(100))
    monkeypatch.setattr(cluster, "free_port", lambda: port if next(calls) == 2 else real())  # the API server's
    try:
        with pytest.raises(cluster.UpError) as err:
            cluster.up("dev", out=tmp_path)
    finally:
        busy.close()
    assert str(err.value).count("\n") == 0
    assert f"port {port}" in str(err.value) and "kube-apiserver" in str(err.value)
    assert _leftovers(cluster.cluster_dir("dev", tmp_path)) == []


def test_a_component_that_exits_at_start_is_named_with_its_log_and_everything_is_stopped(tmp_path, monkeypatch):
    real = components.trainer_config
    monkeypatch.setattr(components, "trainer_config", lambda *a: {**real(*a), "notAField": True})  # strict decoding refuses it
    with pytest.raises(ProcessError) as err:
        cluster.up("dev", out=tmp_path)
    message = str(err.value)
    assert message.startswith("trainer ") and "exited" in message
    assert "notAField" in message  # its last log lines say why
    d = cluster.cluster_dir("dev", tmp_path)
    assert _leftovers(d) == []
    assert (d / "logs" / "trainer.log").is_file()  # kept to read


def test_a_stale_state_directory_is_removed_and_a_live_one_refused(tmp_path):
    d = cluster.cluster_dir("dev", tmp_path)
    procs = Processes(d)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    procs.start("gone", [sys.executable, "-c", "pass"])
    time.sleep(0.5)
    said = []
    cluster.check_stale(d, "dev", echo=said.append)
    assert not d.exists() and "stale" in said[0]

    procs = Processes(d)
    live = procs.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(cluster.UpError) as err:
            cluster.check_stale(d, "dev")
        assert "already running" in str(err.value) and f"pid {live.pid}" in str(err.value) and "cluster-down" in str(err.value)
    finally:
        assert procs.stop_all() == [f"sleeper({live.pid})"]
    assert not alive(live)


def test_a_component_that_dies_is_reported_with_its_last_log_lines(tmp_path):
    procs = Processes(tmp_path / "cluster")
    procs.start("flaky", ["sh", "-c", "echo starting; echo 'fatal: lost etcd' >&2; exit 3"])
    deadline = time.monotonic() + 10
    while procs.dead() == [] and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(ProcessError) as err:
        procs.check()
    assert "flaky" in str(err.value) and "fatal: lost etcd" in str(err.value)


def test_stop_all_only_signals_the_recorded_pids_while_they_are_the_same_process(tmp_path):
    procs = Processes(tmp_path / "cluster")
    p = procs.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    data = json.loads(procs.file.read_text())
    data["processes"][0]["start_time"] = "1"  # a reused pid: another process now
    procs.file.write_text(json.dumps(data))
    other = Processes(tmp_path / "cluster")
    assert other.stop_all() == []  # not ours any more: not signalled
    assert alive(p)
    assert procs.stop_all() == [f"sleeper({p.pid})"]


def test_a_component_that_cannot_be_built_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINING_PLATFORM_CACHE", str(tmp_path))
    unit = build.Unit("sigs.k8s.io/kwok", "v0.0.999", {"kwok": "sigs.k8s.io/kwok/cmd/kwok"})
    with pytest.raises(build.BuildError) as err:
        build.build(unit, echo=lambda *_: None)
    assert "sigs.k8s.io/kwok@v0.0.999" in str(err.value) and str(err.value).count("\n") == 0


def test_the_command_line_says_one_line_for_an_unknown_stack(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.cluster", "up", "--stack", "nosuch", "--out", str(tmp_path)], capture_output=True, text=True, cwd=cluster.PROJECT_DIR, check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "nosuch" in proc.stderr
