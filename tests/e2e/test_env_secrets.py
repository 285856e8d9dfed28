"""A job's env and Secrets on the real API server, as a team member (impersonation with the
access entry's groups): the member writes a Secret with trainctl's write path and cannot read it
back (get, list, watch, patch: 403), cannot make a service-account token Secret, and submits a job
with ``--env`` and ``--secret-env`` whose admitted pods carry the variable (replacing the
runtime's default) and the ``secretKeyRef`` (read through the admin client). docs/env-and-secrets.md."""

from __future__ import annotations

import base64

import pytest

from k8s.builders import admission
from tests.e2e.test_admitted_fields import _node_pods
from tests.e2e.test_teams import STACK, _status, _torch_runtime, as_team, submit
from tools.cluster.client import ApiError
from trainctl import code, objects, secret_cmd
from trainctl.kube import KubeApi, NotAllowed

TEAM = "vision"
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def team(clusters):
    up = clusters.get(STACK)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    return up, access[TEAM], as_team(up, access, TEAM)


def _trainctl_as(up, access) -> KubeApi:
    """trainctl's client as the member (the portal's way: Impersonate-* headers on every call)."""
    return KubeApi(namespace=TEAM, kubeconfig=str(up.kubeconfig), headers={"Impersonate-User": [access.principal], "Impersonate-Group": list(access.groups)})


def test_a_member_writes_a_secret_it_cannot_read_back(team):
    up, access, member = team
    cluster = _trainctl_as(up, access)
    assert secret_cmd.put(cluster, secret_cmd.secret("wandb", TEAM, {"api-key": b"first-value-0001"})) == "created"
    # the same name again is a replace (PUT: verb update, no read first); the old keys are gone
    assert secret_cmd.put(cluster, secret_cmd.secret("wandb", TEAM, {"api-key": b"second-value-002"})) == "replaced"
    stored = up.client().get("v1", "Secret", "wandb", TEAM)
    assert set(stored["data"]) == {"api-key"} and stored["type"] == "Opaque"
    # no way to read it back
    assert _status(lambda: member.get("v1", "Secret", "wandb", TEAM)) == 403
    assert _status(lambda: member.list("v1", "Secret", TEAM)) == 403
    assert _status(lambda: member.request("GET", member.path("v1", "Secret", None, TEAM), params={"watch": "true", "timeoutSeconds": "1"})) == 403
    # a PATCH would answer with the whole Secret: not granted
    assert _status(lambda: member.request("PATCH", member.path("v1", "Secret", "wandb", TEAM), body={"metadata": {"labels": {"x": "y"}}}, content_type=MERGE)) == 403
    # another team's namespace: not even a write
    assert _status(lambda: member.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": "nlp"}, "data": {}})) == 403
    # delete works, and says so without the object
    assert secret_cmd.delete(cluster, "wandb") is True
    assert secret_cmd.delete(cluster, "wandb") is False


def test_a_refused_read_is_one_line_naming_the_verb(team):
    up, access, _ = team
    cluster = _trainctl_as(up, access)
    with pytest.raises(NotAllowed) as err:
        cluster._call("reading secret", cluster.core.read_namespaced_secret, "any", TEAM, read=("get", "secrets"))
    assert "not allowed: get secrets in vision" in str(err.value)


def test_a_member_cannot_make_a_service_account_token_secret(team):
    _, _, member = team
    body = {
        "apiVersion": "v1", "kind": "Secret", "type": admission.SA_TOKEN_SECRET_TYPE,
        "metadata": {"name": "minted", "namespace": TEAM, "annotations": {"kubernetes.io/service-account.name": "default"}},
    }
    with pytest.raises(ApiError) as err:
        member.create(body)
    assert err.value.status == 403 and admission.SA_TOKEN_SECRET_TYPE in str(err.value) and "\n" not in str(err.value)


def test_the_admitted_pods_carry_the_env_and_the_secret_reference(team, tmp_path):
    up, access, member = team
    secret_cmd.put(_trainctl_as(up, access), secret_cmd.secret("wandb", TEAM, {"api-key": b"a-value-not-shown"}))
    (tmp_path / "train.py").write_text("print('hello')\n")
    env, secret_env, lines = objects.env_flags(["NCCL_DEBUG=INFO", "RUN_TAG=e2e"], ["WANDB_API_KEY=wandb/api-key"])
    assert lines == []
    req = objects.Request(namespace=TEAM, nodes=1, command=["python", "train.py"], name="env-job", runtime_name=_torch_runtime(up), env=env, secret_env=secret_env)
    configmap, job = objects.build(req, code.collect(tmp_path))
    submit(member, configmap, job)  # the team admission policy admits secretKeyRef env
    (pod,) = _node_pods(up, TEAM, "env-job", 1)
    (node,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    by_name = {e["name"]: e for e in node["env"]}
    assert by_name["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"}  # the runtime's WARN replaced, once
    assert [e["name"] for e in node["env"]].count("NCCL_DEBUG") == 1
    assert by_name["RUN_TAG"]["value"] == "e2e"
    assert by_name["WANDB_API_KEY"] == {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
    assert "a-value-not-shown" not in str(up.client().get("trainer.kubeflow.org/v1alpha1", "TrainJob", "env-job", TEAM))


def _refused_without_data(fn, value: str) -> None:
    """The request is refused by the team Secret policy, one line, and its answer carries no value."""
    with pytest.raises(ApiError) as err:
        fn()
    answer = f"{err.value} {err.value.body}"
    assert err.value.status == 403 and admission.SECRET_POLICY_NAME in str(err.value) and "\n" not in str(err.value)
    assert value not in answer and base64.b64encode(value.encode()).decode() not in answer


def test_a_delete_that_would_leave_a_finalizer_pending_is_refused_without_the_data(team):
    """A DELETE that leaves a finalizer pending answers with the stored Secret (k8s/builders/admission.py
    SECRET_DELETE_CHECK): dryRun, Foreground, Orphan, orphanDependents are refused; a plain delete works."""
    up, access, member = team
    value = "kept-secret-value-0003"
    cluster = _trainctl_as(up, access)
    assert secret_cmd.put(cluster, secret_cmd.secret("probe", TEAM, {"k": value.encode()})) == "created"
    path = member.path("v1", "Secret", "probe", TEAM)
    for params, body in [
        ({"dryRun": "All"}, {"propagationPolicy": "Foreground"}),
        ({"dryRun": "All"}, None),
        (None, {"propagationPolicy": "Foreground"}),
        (None, {"propagationPolicy": "Orphan"}),
        (None, {"orphanDependents": True}),
        ({"propagationPolicy": "Orphan"}, None),
    ]:
        _refused_without_data(lambda params=params, body=body: member.request("DELETE", path, params=params, body=body), value)
    stored = up.client().get("v1", "Secret", "probe", TEAM)
    assert "deletionTimestamp" not in stored["metadata"] and not stored["metadata"].get("finalizers")
    # the plain deletes: trainctl's (no options) and an explicit Background; each answers with a Status
    answer = member.request("DELETE", path, body={"propagationPolicy": "Background"})
    assert answer["kind"] == "Status" and value not in str(answer) and "data" not in answer
    assert up.client().get_or_none("v1", "Secret", "probe", TEAM) is None
    assert secret_cmd.put(cluster, secret_cmd.secret("probe", TEAM, {"k": value.encode()})) == "created"
    assert secret_cmd.delete(cluster, "probe") is True
    assert up.client().get_or_none("v1", "Secret", "probe", TEAM) is None


def test_a_team_secret_never_carries_a_finalizer(team):
    up, access, member = team
    value = "finalized-value-0004"
    body = {**secret_cmd.secret("held", TEAM, {"k": value.encode()})}
    body["metadata"] = {**body["metadata"], "finalizers": ["example.com/hold"]}
    _refused_without_data(lambda: member.create(body), value)
    assert up.client().get_or_none("v1", "Secret", "held", TEAM) is None
    # an update adding one: refused too
    assert secret_cmd.put(_trainctl_as(up, access), secret_cmd.secret("held", TEAM, {"k": value.encode()})) == "created"
    _refused_without_data(lambda: member.request("PUT", member.path("v1", "Secret", "held", TEAM), body=body), value)
    assert not up.client().get("v1", "Secret", "held", TEAM)["metadata"].get("finalizers")
    # a Secret that carries one (put there by an admin): the team's plain delete would answer with it, so refused
    admin = up.client()
    admin.request("PATCH", admin.path("v1", "Secret", "held", TEAM), body={"metadata": {"finalizers": ["example.com/hold"]}}, content_type=MERGE)
    try:
        _refused_without_data(lambda: member.request("DELETE", member.path("v1", "Secret", "held", TEAM)), value)
        assert "deletionTimestamp" not in admin.get("v1", "Secret", "held", TEAM)["metadata"]
    finally:
        admin.request("PATCH", admin.path("v1", "Secret", "held", TEAM), body={"metadata": {"finalizers": None}}, content_type=MERGE)
        admin.delete("v1", "Secret", "held", TEAM)
