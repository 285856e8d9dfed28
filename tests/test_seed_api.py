"""The seed guide's fields as the portal judges them, in process (no server, no job started unless
said): Kubernetes quantities for the resources, one problem per field whatever JSON type comes,
the guide's job names, and no cross-origin grant for the methods that need no CSRF token."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from tests.seed_guide import GUIDE_CREATE
from trainctl import local
from trainctl.portal.submission import JobSpec, Problems, guide_name, request_of
from trainctl.ui import build_local

PORT = 8767
BASE = {"namespace": "local", "framework": "pytorch", "training_code": "print(1)"}


def _memory(value) -> int | list:
    try:
        return request_of(JobSpec(namespace="vision", framework="pytorch", num_nodes=1, gpu_per_node=1, memory_per_node=value), None).instance_type and 0  # type: ignore[return-value]
    except Problems as err:
        return err.problems


@pytest.mark.parametrize("value", ["16Gi", "16G", "16", 16, "16.0", "16384Mi", ".5Gi", "1e3"])
def test_memory_takes_quantities_and_numbers_of_gib(value):
    assert _memory(value) == 0


@pytest.mark.parametrize("value", ["inf", "Infinity", "NaN", "sNaN", "1e999999", "1e9999999", "-1", "+16", "1_6", "16 Gi", "lots", "100Ti", "0", "", "٣"])
def test_memory_refuses_what_kubernetes_would_and_what_no_pool_has_in_one_line(value):
    if value == "":  # not given: the pool's own sizing
        assert _memory(value) == 0
        return
    problems = _memory(value)
    assert isinstance(problems, list) and [p["field"] for p in problems] == ["config.memory_per_node"], problems


def test_guide_names_are_labels_that_fit_and_keep_users_apart():
    when = datetime(2025, 11, 5, 13, 0, 0, tzinfo=UTC)
    assert guide_name("user123", 2, when) == "user123-job-20251105130000"
    a, b = guide_name("alice@example.com", 2, when), guide_name("alice-example-com", 2, when)
    assert a != b and a.endswith("-job-20251105130000") and b == "alice-example-com-job-20251105130000"
    assert len(guide_name("x" * 200, 999, when)) <= 63 - len("-node-0-998-abcde")


@pytest.fixture
def ui(tmp_path, monkeypatch):
    monkeypatch.setenv(local.HOME_ENV, str(tmp_path / "state"))
    app, _ = build_local(PORT)
    with TestClient(app, base_url=f"http://127.0.0.1:{PORT}") as c:
        yield c
    for job in local.jobs():
        local.delete(job["name"])


@pytest.mark.parametrize(("config", "field"), [
    ({"num_nodes": 1, "gpu_per_node": 1, "memory_per_node": 4.5}, "config.memory_per_node"),
    ({"num_nodes": 1, "gpu_per_node": 1, "memory_per_node": True}, "config.memory_per_node"),
    ({"num_nodes": 1, "gpu_per_node": 1, "cpu_per_node": [4]}, "config.cpu_per_node"),
    ({"num_nodes": True, "gpu_per_node": 1}, "config.num_nodes"),
    ({"num_nodes": 1, "gpu_per_node": "1"}, "config.gpu_per_node"),
])
def test_a_value_of_the_wrong_json_type_is_one_problem_of_its_field(ui, config, field):
    r = ui.post("/api/trainjob/create", json={**BASE, "config": config})
    assert r.status_code == 422 and r.json()["problems"] == [{"field": field, "problem": r.json()["problems"][0]["problem"]}], r.json()
    assert not local.jobs()


def test_true_is_no_ttl(ui):
    r = ui.post("/api/trainjob/create", json={**BASE, "config": {"num_nodes": 1, "gpu_per_node": 1}, "ttl_seconds_after_finished": True})
    assert r.status_code == 422 and [p["field"] for p in r.json()["problems"]] == ["ttl_seconds_after_finished"]


def test_no_cross_origin_request_is_granted(ui):
    """DELETE needs no CSRF token because a page of another origin cannot send it without a CORS
    preflight, which this API never grants: no Access-Control-Allow-* on any answer."""
    r = ui.options("/api/trainjob/x", params={"namespace": "local"}, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "DELETE"})
    assert r.status_code >= 400 and not [h for h in r.headers if h.lower().startswith("access-control-")]
    r = ui.delete("/api/trainjob/x", params={"namespace": "local"}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 404 and not [h for h in r.headers if h.lower().startswith("access-control-")]


@pytest.mark.slow
def test_a_second_guide_request_in_the_same_second_is_refused_not_merged(ui, monkeypatch):
    import json

    from trainctl.portal import api

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ARG003
            return datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)

    monkeypatch.setattr(api, "datetime", Frozen)
    body = json.loads(GUIDE_CREATE)
    body.update(namespace="local", training_code="print('hi')")
    body["config"]["num_nodes"] = 1
    first = ui.post("/api/trainjob/create", json=body)
    assert first.status_code == 200 and first.json()["trainjob_name"] == "user123-job-20261128120000", first.json()
    second = ui.post("/api/trainjob/create", json=body)
    assert second.status_code == 409 and [p["field"] for p in second.json()["problems"]] == ["name"], second.json()
    assert [j["name"] for j in local.jobs()] == ["user123-job-20261128120000"]
