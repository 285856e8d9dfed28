"""The portal's API against a real API server (the teams stack with portal.enabled, applied on a
local control plane): two users of two teams, identities signed as the ALB signs them (with a test
key given to the app factory), every Kubernetes call made through the portal service account's
impersonation, and the API server judging. A team's backend with its own bearer token too."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from fastapi.testclient import TestClient
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s.builders import portal as mp
from k8s.builders.tenants import team_group, team_role
from tests.e2e.conftest import require_kueue_visibility, wait_for
from tests.e2e.portal_helpers import INSTANCE, STACK, admin_api, alb_header, alb_keys, portal_configuration, portal_stack, rendered_settings
from tests.seed_guide import GUIDE_CREATE, TIMESTAMP_NAME
from trainctl.portal.app import create_app

TRAINJOBS = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JSON = {"content-type": "application/json"}  # a change from a signed-in session: JSON or the CSRF header (api.py _mutation_allowed)


@pytest.fixture(scope="module")
def portal(clusters):
    up = clusters.get(STACK, instance=INSTANCE, stack_config=portal_stack())
    app = create_app(portal_configuration(up), rendered_settings(up), alb_keys=alb_keys)
    yield up, TestClient(app, raise_server_exceptions=False)
    clusters.release(STACK, INSTANCE)


def _jobs(up, ns: str) -> list[str]:
    found = client.CustomObjectsApi(admin_api(up)).list_namespaced_custom_object(*TRAINJOBS[:2], ns, TRAINJOBS[2])
    return sorted(t["metadata"]["name"] for t in found["items"])


def _configmaps(up, ns: str) -> list[str]:
    return sorted(c.metadata.name for c in client.CoreV1Api(admin_api(up)).list_namespaced_config_map(ns).items)


def _create(c, headers, ns="vision", name="portal-e2e", nodes=2, gpus=1, cpu=2, memory=8, code="print('hello from the portal')\n"):
    return c.post("/api/trainjob/create", headers=headers, json={"namespace": ns, "framework": "pytorch", "training_code": code, "name": name,
                                                               "config": {"num_nodes": nodes, "gpu_per_node": gpus, "cpu_per_node": cpu, "memory_per_node": memory}})


def test_the_stack_renders_the_portal_and_its_service_account_may_only_impersonate_the_teams(portal):
    up, _ = portal
    role = next(o for o in up.plan.objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == mp.IMPERSONATOR)
    teams = sorted(portal_stack()["config"]["training-platform:tenants"])
    assert sorted(role["rules"][1]["resourceNames"]) == sorted(team_group(t) for t in teams)
    assert sorted(role["rules"][0]["resourceNames"]) == sorted(mp.portal_user(t) for t in teams)
    sa = client.ApiClient(portal_configuration(up))
    review = client.AuthorizationV1Api(sa)

    def may(attrs: dict) -> bool:
        return review.create_self_subject_access_review({"spec": {"resourceAttributes": attrs}}).status.allowed

    for team in teams:
        assert may({"verb": "impersonate", "resource": "groups", "name": team_group(team)})
        assert may({"verb": "impersonate", "resource": "users", "name": mp.portal_user(team)})
    for group in ("system:masters", "system:authenticated", "training-platform:team:other"):
        assert not may({"verb": "impersonate", "resource": "groups", "name": group})
    for user in ("system:admin", "system:kube-controller-manager", "portal:other", "alice"):
        assert not may({"verb": "impersonate", "resource": "users", "name": user})
    assert not may({"verb": "impersonate", "resource": "serviceaccounts", "namespace": "kube-system", "name": "default"})
    assert not may({"verb": "impersonate", "resource": "uids", "group": "authentication.k8s.io"})
    for verb, resource, ns in (("list", "pods", "vision"), ("create", "configmaps", "vision"), ("get", "secrets", "platform-portal"), ("list", "nodes", "")):
        assert not may({"verb": verb, "resource": resource, "namespace": ns}), (verb, resource)
    # the portal's pod was admitted under Pod Security restricted (its namespace enforces it)
    pods = client.CoreV1Api(admin_api(up)).list_namespaced_pod("platform-portal", label_selector="app.kubernetes.io/name=portal").items
    assert pods and client.CoreV1Api(admin_api(up)).read_namespace("platform-portal").metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_create_runs_to_complete_with_logs_and_delete_removes_it(portal):
    up, c = portal
    alice = alb_header(up, "alice", "vision")
    r = _create(c, alice)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success" and body["trainjob_name"] == "portal-e2e" and body["namespace"] == "vision" and body["created_at"]
    states = set()

    def complete():
        s = c.get("/api/trainjob/portal-e2e/status", params={"namespace": "vision"}, headers=alice).json()
        states.add(s["status"])
        return s if s["status"] in ("Complete", "Failed") else None

    final = wait_for("the portal job to complete", complete, up, timeout=120)
    assert final["status"] == "Complete" and final["completed_at"] and final["created_at"]
    assert "Running" in states, states
    logs = c.get("/api/trainjob/portal-e2e/logs", params={"namespace": "vision", "worker": 1}, headers=alice).json()
    assert "simulated (kwok) node" in logs["logs"] and logs["worker"] == 1
    lines = []
    with c.stream("GET", "/api/trainjob/portal-e2e/logs/stream", params={"namespace": "vision", "worker": 0}, headers=alice) as stream:
        for line in stream.iter_lines():  # a finished container is read once: the stream ends by itself
            lines.append(line)
            if line.startswith("event: end"):
                break
    text = "\n".join(lines)
    assert "event: line" in text and "simulated (kwok) node" in text and "event: end" in text
    with c.stream("GET", "/api/trainjob/portal-e2e/state/stream", params={"namespace": "vision"}, headers=alice) as stream:
        events = [line for line in stream.iter_lines() if line.startswith(("event: ", "data: "))]  # a finished job: its state, then the end
    assert events[0] == "event: state" and '"status": "Complete"' in events[1] and '"cancel": false' in events[1]
    assert events[2:] == ["event: end", 'data: {"reason": "finished", "message": "the job has finished (Complete)", "status": "Complete"}'], events
    assert c.get("/api/trainjob/portal-e2e/progress", params={"namespace": "vision"}, headers=alice).json()["points"] == []  # kwok's pods print no step events
    listed = c.get("/api/trainjobs", params={"namespace": "vision"}, headers=alice).json()["items"]
    assert any(j["trainjob_name"] == "portal-e2e" and j["gpus"] == 2 for j in listed)
    assert c.get("/api/trainjob/portal-e2e/events", params={"namespace": "vision"}, headers=alice).json()["items"]
    assert c.get("/api/trainjob/portal-e2e/diagnosis", params={"namespace": "vision"}, headers=alice).status_code == 200
    assert c.get("/api/trainjob/portal-e2e/logs", params={"namespace": "vision", "worker": 2}, headers=alice).status_code == 422
    r = c.delete("/api/trainjob/portal-e2e", params={"namespace": "vision"}, headers={**alice, **JSON})
    assert r.status_code == 200 and r.json()["status"] == "deleted"
    assert "portal-e2e" not in _jobs(up, "vision")


def test_the_seed_guides_four_calls_as_written(portal):
    """The guide's create body byte for byte (tests/seed_guide.py), sent by a
    client behind the ALB (its header added by the ALB, an IdP without an email claim: the user is
    user123), the answers read by the guide's names; the same client runs against trainctl ui --local."""
    up, c = portal
    alb = alb_header(up, "user123", "user-123", email=False)
    r = c.post("/api/trainjob/create", headers={**alb, "Content-Type": "application/json"}, content=GUIDE_CREATE)
    assert r.status_code == 200, r.text
    created = r.json()
    assert created["status"] == "success" and created["namespace"] == "user-123" and created["created_at"]
    assert TIMESTAMP_NAME.fullmatch(created["trainjob_name"]), created
    name = created["trainjob_name"]

    def done():
        s = c.get(f"/api/trainjob/{name}/status?namespace=user-123", headers=alb).json()
        return s if s["state"] in ("Complete", "Failed") else None

    final = wait_for("the guide's job to finish", done, up, timeout=180)
    assert final["state"] == "Complete" and final["trainjob_name"] == name and final["completed_at"] and isinstance(final["message"], str)
    logs = c.get(f"/api/trainjob/{name}/logs?namespace=user-123&worker=0", headers=alb).json()
    assert logs["trainjob_name"] == name and logs["worker"] == 0 and isinstance(logs["logs"], str)
    r = c.delete(f"/api/trainjob/{name}?namespace=user-123", headers=alb)  # no body, no other header: the guide's DELETE
    assert r.status_code == 200, r.text
    assert name not in _jobs(up, "user-123")


def test_another_team_is_refused_by_the_api_server(portal):
    up, c = portal
    alice, bob = alb_header(up, "alice", "vision"), alb_header(up, "bob", "nlp")
    assert _create(c, alice, name="vision-private").status_code == 200
    for method, path in (("GET", "/api/trainjob/vision-private/status"), ("GET", "/api/trainjob/vision-private/logs"), ("GET", "/api/trainjob/vision-private/logs/stream"),
                         ("GET", "/api/trainjob/vision-private/events"), ("DELETE", "/api/trainjob/vision-private"), ("GET", "/api/trainjobs"), ("GET", "/api/trainjob/vision-private/queue"),
                         ("GET", "/api/trainjob/vision-private/state/stream"), ("GET", "/api/trainjobs/stream"), ("GET", "/api/trainjob/vision-private/progress"),
                         ("GET", "/api/trainjob/vision-private/chart.svg")):
        r = c.request(method, path, params={"namespace": "vision"}, headers={**bob, **JSON})
        assert r.status_code == 403, (method, path, r.text)
        assert 'User \\"portal:nlp\\"' in r.text or "portal:nlp" in r.text  # the API server's answer, as the impersonated user
    team = c.get("/api/team", params={"namespace": "vision"}, headers=bob).json()
    assert team["error"].startswith("not allowed: "), team  # the API server refused the read (trainctl/kube.py NotAllowed)
    r = _create(c, bob, ns="vision", name="intruder")
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "namespace"
    assert "vision-private" in _jobs(up, "vision") and "intruder" not in _jobs(up, "vision")
    c.delete("/api/trainjob/vision-private", params={"namespace": "vision"}, headers={**alice, **JSON})


def test_a_job_over_the_quota_is_queued_with_its_position(portal):
    up, c = portal
    bob = alb_header(up, "bob", "nlp")
    r = _create(c, bob, ns="nlp", name="too-big", nodes=9, gpus=4, cpu=16, memory=64)  # 36 GPUs: beyond nlp's 8 and all the cohort lends
    assert r.status_code == 200, r.text

    def queued():
        s = c.get("/api/trainjob/too-big/status", params={"namespace": "nlp"}, headers=bob).json()
        return s if s["status"] == "Queued" and s.get("queue", {}).get("position") is not None else None

    s = wait_for("the over-quota job queued with a position", queued, up, timeout=90)
    assert s["queue"]["position"] == 0 and "too-big" not in s["queue"]["ahead"]
    team = c.get("/api/team", params={"namespace": "nlp"}, headers=bob).json()
    assert team["gpu_quota"] == 8 and any(i["job"] == "too-big" for i in team["queue"]["items"])
    c.delete("/api/trainjob/too-big", params={"namespace": "nlp"}, headers={**bob, **JSON})


BAD = {
    "name": ({"name": "Bad_Name"}, "name"),
    "nodes": ({"config": {"num_nodes": 0, "gpu_per_node": 1}}, "config.num_nodes"),
    "too-many-nodes": ({"config": {"num_nodes": 5000, "gpu_per_node": 1}}, "config.num_nodes"),
    "gpus": ({"config": {"num_nodes": 1, "gpu_per_node": 99}}, "config.gpu_per_node"),
    "not-a-number": ({"config": {"num_nodes": "two", "gpu_per_node": 1}}, "config.num_nodes"),
    "cpus-no-type-gives": ({"config": {"num_nodes": 1, "gpu_per_node": 1, "cpu_per_node": 4000}}, "config.cpu_per_node"),
    "framework": ({"framework": "jax"}, "framework"),
    "mpi": ({"framework": "mpi"}, "framework"),
    "image": ({"image": "nope"}, "image"),
    "image-latest": ({"image": "registry.example.com/x:latest"}, "image"),
    "code-too-big": ({"training_code": "x" * (1024 * 1024 + 1)}, "training_code"),
    "namespace": ({"namespace": "nlp"}, "namespace"),
    "unknown-key": ({"priority_boost": True}, "priority_boost"),
    "secret-in-command": ({"command": "python train.py --api-key=abc123secret"}, "request"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_4xx_naming_the_problem_and_creates_nothing(portal, case):
    up, c = portal
    alice = alb_header(up, "alice", "vision")
    change, field = BAD[case]
    body = {"namespace": "vision", "framework": "pytorch", "training_code": "print(1)\n", "name": f"bad-{case}"[:40], "config": {"num_nodes": 1, "gpu_per_node": 1}, **change}
    before = (_jobs(up, "vision"), _configmaps(up, "vision"))
    r = c.post("/api/trainjob/create", headers=alice, json=body)
    assert 400 <= r.status_code < 500, r.text
    problems = r.json()["problems"]
    assert field in [p["field"] for p in problems], problems
    assert "Traceback" not in r.text and "abc123secret" not in r.text
    # nothing created (another test's deleted job may still be losing its owned ConfigMaps meanwhile)
    assert not set(_jobs(up, "vision")) - set(before[0]) and not set(_configmaps(up, "vision")) - set(before[1])


def test_non_utf8_and_unsafe_uploads_are_refused(portal):
    up, c = portal
    alice = {**alb_header(up, "alice", "vision")}
    page = c.get("/submit", headers=alice).text
    import re

    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    form = {"namespace": "vision", "framework": "pytorch", "num_nodes": "1", "gpu_per_node": "1"}
    before = _jobs(up, "vision")
    for files, why in (({"files": ("train.py", "print('é')".encode("latin-1"))}, "not UTF-8"), ({"files": ("../x.py", b"print(1)")}, "not a relative path")):
        r = c.post("/api/trainjob/upload", headers={**alice, "x-csrf-token": token}, files=files, data=form)
        assert r.status_code == 422 and why in r.text, r.text
    assert _jobs(up, "vision") == before


@pytest.mark.parametrize("how", ["none", "forged", "expired", "other-alb", "other-account"])
def test_a_missing_forged_expired_or_foreign_identity_is_401(portal, how):
    from cryptography.hazmat.primitives.asymmetric import ec

    up, c = portal
    signer = rendered_settings(up).signer + "0123456789abcdef"
    headers = {
        "none": {},
        "forged": alb_header(up, "alice", "vision", key=ec.generate_private_key(ec.SECP256R1())),
        "expired": alb_header(up, "alice", "vision", exp_in=-300),
        "other-alb": alb_header(up, "alice", "vision", signer_arn=signer.replace("/app/", "/app/x").replace("0123456789abcdef", "fedcba9876543210")),
        "other-account": alb_header(up, "alice", "vision", signer_arn=signer.replace(":123456789012:", ":999999999999:")),
    }[how]
    for method, path in (("GET", "/api/trainjobs?namespace=vision"), ("DELETE", "/api/trainjob/x?namespace=vision"), ("GET", "/")):
        r = c.request(method, path, headers=headers)
        assert r.status_code == 401, (how, path, r.text)


def test_a_teams_backend_with_its_own_bearer_token_is_judged_by_the_api_server(portal):
    up, c = portal
    admin = admin_api(up)
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    try:
        core.create_namespaced_service_account("vision", {"metadata": {"name": "team-backend"}})
        rbac.create_namespaced_role_binding("vision", {"metadata": {"name": "team-backend"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": team_role("vision")},
                                                       "subjects": [{"kind": "ServiceAccount", "name": "team-backend", "namespace": "vision"}]})
    except ApiException as err:
        if err.status != 409:
            raise
    token = core.create_namespaced_service_account_token("team-backend", "vision", {"spec": {"expirationSeconds": 600}}).status.token
    bearer = {"Authorization": f"Bearer {token}"}
    # the stack's default (portal.apiBearerTokens false): refused before the API server sees it
    r = c.get("/api/trainjobs", params={"namespace": "vision"}, headers=bearer)
    assert r.status_code == 401 and "apiBearerTokens" in r.text
    c = TestClient(create_app(portal_configuration(up), dataclasses.replace(rendered_settings(up), bearer_tokens=True), alb_keys=alb_keys), raise_server_exceptions=False)
    assert c.get("/api/trainjobs", params={"namespace": "vision"}, headers=bearer).status_code == 200
    r = c.get("/api/trainjobs", params={"namespace": "nlp"}, headers=bearer)
    assert r.status_code == 403 and "system:serviceaccount:vision:team-backend" in r.text
    assert c.get("/api/trainjobs", params={"namespace": "vision"}, headers={"Authorization": "Bearer not-a-token"}).status_code == 401
    # pages take no bearer token: only the ALB's login
    assert c.get("/", headers=bearer).status_code == 401
    time.sleep(0)


def test_queue_position_comes_from_kueues_visibility_api_as_the_user(portal):
    """Kueue's visibility API (served on the local control plane through the aggregation layer:
    tools/cluster/components.py) answers the portal's user, impersonated: Kueue's own places in the
    LocalQueue and the ClusterQueue, not an estimate (the fallback, where it is not served, is
    tests/test_trainctl_access.py's). queued-b is created a second after queued-a's Workload exists,
    so their order is their age, whichever way a tie would break."""
    up, c = portal
    require_kueue_visibility(up)
    bob = alb_header(up, "bob", "nlp")

    def position(name):
        return c.get(f"/api/trainjob/{name}/queue", params={"namespace": "nlp"}, headers=bob).json()

    assert _create(c, bob, ns="nlp", name="queued-a", nodes=9, gpus=4, cpu=16, memory=64).status_code == 200
    wait_for("queued-a's queue position", lambda: position("queued-a")["position"] is not None or None, up, timeout=90)
    time.sleep(1.1)
    assert _create(c, bob, ns="nlp", name="queued-b", nodes=9, gpus=4, cpu=16, memory=64).status_code == 200

    def both():
        b = position("queued-b")
        a = position("queued-a")  # after b's: b's Workload exists by then
        return (a, b) if b["position"] is not None else None

    a, b = wait_for("both jobs' queue positions", both, up, timeout=90)
    assert not a["estimated"] and a["source"] == "kueue visibility API"
    assert (a["position"], b["position"]) == (0, 1) and b["ahead"] == ["queued-a"] and a["ahead"] == []
    assert (a["position_in_cluster_queue"], b["position_in_cluster_queue"]) == (0, 1)
    for name in ("queued-a", "queued-b"):
        c.delete(f"/api/trainjob/{name}", params={"namespace": "nlp"}, headers={**bob, **JSON})
    json.dumps(a)
