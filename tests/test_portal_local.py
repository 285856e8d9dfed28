"""``trainctl ui --local``: the portal's pages and API over the jobs trainctl's local mode runs on
this machine (trainctl/portal/local_service.py), no kubeconfig and no Kubernetes. The same routes
and checks as the cluster's portal (trainctl/portal/backend.py): a tiny job submitted through the
API runs and finishes, its log is read and streamed, a running job is cancelled, a failing one is
diagnosed; bad input is one problem per field and starts nothing."""

from __future__ import annotations

import inspect
import time

import pytest
from fastapi.testclient import TestClient

from trainctl import cli, local
from trainctl.portal import backend, local_service, service
from trainctl.ui import build_local

PORT = 8766
HELLO = "import os, time\nprint('hello from rank', os.environ['RANK'], flush=True)\ntime.sleep(2)\nprint('done', os.environ['RANK'], flush=True)\n"
SLEEPS = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"
EXIT_3 = "import os, sys\nif os.environ['RANK'] == '1':\n    print('bad config: column text not found', file=sys.stderr, flush=True)\n    sys.exit(3)\nimport time; time.sleep(2)\n"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def ui(home):  # noqa: ARG001  (local jobs land in the test's own state directory)
    app, url = build_local(PORT)
    assert url == f"http://127.0.0.1:{PORT}/"
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}") as c:
        yield c
    for job in local.jobs():  # nothing a failed test started keeps running
        local.delete(job["name"])


def _create(c, name: str, code: str, *, nodes: int = 2, namespace: str = "local", **extra):
    return c.post("/api/trainjob/create", json={"namespace": namespace, "framework": "pytorch", "training_code": code, "name": name,
                                               "config": {"num_nodes": nodes, "gpu_per_node": 1, **extra}})


def _wait(c, name: str, until, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        status = c.get(f"/api/trainjob/{name}/status").json()
        if until(status):
            return status
        time.sleep(0.5)
    raise AssertionError(f"{name}: {status}")


def test_both_backends_answer_every_call_the_routes_make_with_the_same_parameters():
    for method in [m for m in dir(backend.Backend) if not m.startswith("_") and callable(getattr(backend.Backend, m))]:
        want = list(inspect.signature(getattr(backend.Backend, method)).parameters)
        for impl in (service.Portal, local_service.LocalPortal):
            assert list(inspect.signature(getattr(impl, method)).parameters) == want, (impl.__name__, method)
    assert service.Portal.mode_note is None and "no Kubernetes" in (local_service.LocalPortal.mode_note or "")


def test_the_page_says_it_is_local_and_nothing_reads_a_kubeconfig(ui, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")  # never read in local mode
    page = ui.get("/")
    assert page.status_code == 200 and 'id="mode"' in page.text and "Local mode: jobs run on this machine" in page.text
    assert "No jobs yet" in page.text
    assert ui.get("/api/whoami").json() == {"name": "you (this machine)", "team": None, "namespace": "local", "via": "local"}
    assert ui.get("/submit").status_code == 200 and ui.get("/team").status_code == 200
    # another Host (a page elsewhere pointing a name of its own at 127.0.0.1) is refused
    assert TestClient(ui.app, base_url=f"http://evil.example:{PORT}").get("/api/trainjobs").status_code == 401


def test_bad_input_is_one_problem_per_field_and_starts_nothing(ui, home):
    r = ui.post("/api/trainjob/create", json={"namespace": "Not_A_Label", "framework": "mpi", "training_code": "print(1)", "name": "Bad_Name", "config": {"num_nodes": 0, "gpu_per_node": 1}})
    assert r.status_code == 422
    fields = sorted(p["field"] for p in r.json()["problems"])
    assert fields == ["config.num_nodes", "framework", "name", "namespace"], r.json()
    r = _create(ui, "too-many", "print(1)", nodes=local.MAX_LOCAL_NODES + 1)
    assert r.status_code == 422 and [p["field"] for p in r.json()["problems"]] == ["config.num_nodes"]
    assert "at most" in r.json()["problems"][0]["problem"]
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())
    assert ui.get("/api/trainjob/nope/status").status_code == 404
    assert ui.get("/api/trainjob/nope/status", params={"namespace": "vision"}).status_code == 404
    # a browser form without the CSRF token changes nothing
    assert ui.post("/submit", data={"framework": "pytorch", "num_nodes": "1", "preset": "small", "training_code": "print(1)"}).status_code == 401


def test_trainctl_ui_local_refuses_cluster_flags_all_at_once(capsys):
    rc = cli.main(["ui", "--local", "--kubeconfig", "k", "--namespace", "vision", "--port", "0"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2
    assert err == ["trainctl: error: --port 0: allowed: 1 to 65535", "trainctl: error: --kubeconfig: not with --local (local jobs need no cluster)",
                   "trainctl: error: --namespace: not with --local (local jobs need no cluster)"]


@pytest.mark.slow
def test_a_tiny_job_runs_to_complete_and_its_log_is_read_and_streamed(ui):
    r = _create(ui, "hello", HELLO)
    assert r.status_code == 200, r.text
    assert r.json()["trainjob_name"] == "hello" and r.json()["namespace"] == "local"
    assert [j["trainjob_name"] for j in ui.get("/api/trainjobs").json()["items"]] == ["hello"]
    # followed while it runs: worker 1's lines only, then the end
    with ui.stream("GET", "/api/trainjob/hello/logs/stream", params={"worker": 1}) as s:
        body = s.read().decode()
    lines = [ln.removeprefix("data: ") for ln in body.splitlines() if ln.startswith("data: [")]
    assert lines == ["[attempt 0 node 1 rank 1] hello from rank 1", "[attempt 0 node 1 rank 1] done 1"], body
    assert "event: end" in body and '"status": "Complete"' in body
    done = _wait(ui, "hello", lambda s: s["status"] != "Running")
    assert done["status"] == "Complete" and done["restarts"] == 0 and done["completed_at"] and [w["worker"] for w in done["workers"]] == [0, 1]
    tail = ui.get("/api/trainjob/hello/logs", params={"worker": 0}).json()
    assert tail["logs"].splitlines() == ["[attempt 0 node 0 rank 0] hello from rank 0", "[attempt 0 node 0 rank 0] done 0"]
    assert ui.get("/api/trainjob/hello/logs", params={"worker": 2}).status_code == 422
    page = ui.get("/jobs/hello")
    assert page.status_code == 200 and "Complete" in page.text and "Local mode" in page.text
    clone = ui.get("/submit", params={"clone": "hello"})
    assert "hello from rank" in clone.text  # the form holds the job's train.py


@pytest.mark.slow
def test_a_running_job_is_cancelled_and_a_failing_one_diagnosed(ui, home):
    assert _create(ui, "sleeper", SLEEPS, nodes=1).status_code == 200
    assert _create(ui, "exits-three", EXIT_3).status_code == 200
    _wait(ui, "sleeper", lambda s: s["status"] == "Running" and "started" in ui.get("/api/trainjob/sleeper/logs").json()["logs"])
    page = ui.get("/jobs/sleeper")
    csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    r = ui.post("/jobs/sleeper/cancel", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/?cancelled=sleeper"
    assert not (home / "jobs" / "sleeper").exists()
    assert ui.get("/api/trainjob/sleeper/status").status_code == 404
    failed = _wait(ui, "exits-three", lambda s: s["status"] != "Running")
    assert failed["status"] == "Failed" and "exited with code 3" in (failed["last_failure"] or "")
    findings = ui.get("/api/trainjob/exits-three/diagnosis").json()["findings"]
    assert findings and any("bad config" in line for f in findings for line in f["evidence"]), findings
    assert ui.delete("/api/trainjob/exits-three", headers={"content-type": "application/json"}).json()["status"] == "deleted"  # a change: JSON or the CSRF header
    assert ui.get("/api/trainjobs").json()["items"] == []
