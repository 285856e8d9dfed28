"""The seed backend guide's API as its clients call it (the guide's four calls, bodies byte for byte
as the guide writes them, answers read by the guide's field names and types) against ``trainctl ui
--local`` started as users start it: the installed ``trainctl`` entry point, a real HTTP server on
127.0.0.1, the job run on this machine by the emulator. The same client runs against the portal on
the local control plane in tests/e2e/test_portal.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.browser import free_port
from tests.seed_guide import GUIDE_CREATE, TIMESTAMP_NAME
from trainctl import local

pytestmark = pytest.mark.slow  # a trainctl ui --local server of its own, jobs run by the emulator


def _call(method: str, url: str, body: bytes | None = None) -> tuple[int, dict]:
    """One HTTP call as the guide's clients make it: JSON in and out, no other header."""
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def served(tmp_path):
    """``trainctl ui --local --port P`` from this environment's installed entry point."""
    port = free_port()
    env = {**os.environ, local.HOME_ENV: str(tmp_path / "state")}
    trainctl = Path(sys.executable).with_name("trainctl")
    proc = subprocess.Popen([str(trainctl), "ui", "--local", "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                break
        except OSError:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.3)
    yield base
    os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and nothing else
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_guides_four_calls_run_a_job_to_complete_read_its_log_and_delete_it(served):
    before = datetime.now(UTC).replace(microsecond=0)
    code, created = _call("POST", f"{served}/api/trainjob/create", GUIDE_CREATE)
    assert code == 200, created
    assert created["status"] == "success" and created["namespace"] == "user-123"
    stamp = TIMESTAMP_NAME.fullmatch(created["trainjob_name"])
    assert stamp, created["trainjob_name"]
    assert before <= datetime.strptime(stamp.group(1), "%Y%m%d%H%M%S").replace(tzinfo=UTC) <= datetime.now(UTC)
    assert isinstance(created["created_at"], str) and created["created_at"]
    name = created["trainjob_name"]

    deadline, status = time.monotonic() + 300, {}
    while time.monotonic() < deadline:
        code, status = _call("GET", f"{served}/api/trainjob/{name}/status?namespace=user-123")
        assert code == 200, status
        if status["state"] in ("Complete", "Failed"):
            break
        time.sleep(1)
    assert status["state"] == "Complete", status
    assert status["trainjob_name"] == name and isinstance(status["message"], str)
    assert status["created_at"] and status["completed_at"] and status["completed_at"] >= status["created_at"]

    code, logs = _call("GET", f"{served}/api/trainjob/{name}/logs?namespace=user-123&worker=0")
    assert code == 200, logs
    assert logs["trainjob_name"] == name and logs["worker"] == 0 and isinstance(logs["logs"], str)

    code, deleted = _call("DELETE", f"{served}/api/trainjob/{name}?namespace=user-123")
    assert code == 200, deleted
    assert _call("GET", f"{served}/api/trainjob/{name}/status?namespace=user-123")[0] == 404


def test_the_guides_quantities_and_a_second_create_of_the_same_code(served):
    """``memory_per_node: "16Gi"`` is a quantity, not a 422; the same request a second later is a
    second job (a new timestamp), not a conflict."""
    body = json.loads(GUIDE_CREATE)
    body["training_code"] = "print('hi')"
    body["config"]["num_nodes"] = 1
    names = []
    for _ in range(2):
        code, created = _call("POST", f"{served}/api/trainjob/create", json.dumps(body).encode())
        assert code == 200, created
        names.append(created["trainjob_name"])
        time.sleep(1.1)
    assert len(set(names)) == 2 and all(TIMESTAMP_NAME.fullmatch(n) for n in names), names
    for bad, field in (({"memory_per_node": "lots"}, "config.memory_per_node"), ({"cpu_per_node": "4x"}, "config.cpu_per_node"), ({"memory_per_node": "100Ti"}, "config.memory_per_node")):
        wrong = {**body, "config": {**body["config"], **bad}}
        code, answer = _call("POST", f"{served}/api/trainjob/create", json.dumps(wrong).encode())
        assert code == 422 and [p["field"] for p in answer["problems"]] == [field], answer
    for n in names:
        assert _call("DELETE", f"{served}/api/trainjob/{n}?namespace=user-123")[0] == 200
