"""The portal's review fixes (issue 36): the ALB controller may read the OIDC Secret and no other,
the guard refuses unauthenticated and oversized bodies unread, keep-alive beyond the ALB's idle
timeout, no Service webhook, bearer tokens off by default, verified e-mails only, valid distinct
ALB names, a key fetch that cannot be flooded, DELETE's cross-site check, the readiness gate and
preStop sleep, the Regions of the aws partition only, and a 401 that names the claims it saw."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from config import aws_facts
from config.portal_models import PortalSettings, portal_rules
from k8s import portal as kp
from k8s.builders import portal as mp
from tests.test_portal import ALB_FORWARDED, ARN, PUB, TEAMS, alb_token, verifier
from trainctl.portal import __main__ as entry
from trainctl.portal import guard
from trainctl.portal.app import Settings, create_app
from trainctl.portal.identity import KeyFetcher, KeyUnavailable, Unauthorized


def _app(**settings) -> TestClient:
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"  # nothing listens: no test here reaches a cluster
    return TestClient(create_app(cfg, Settings(mode="alb", region="us-west-2", signer=ARN, teams=TEAMS, **settings), alb_keys=lambda kid: PUB), raise_server_exceptions=False, headers=ALB_FORWARDED)


# 1. the controller reads the OIDC Secret: a Role on that one Secret, bound to the chart's service account


def test_the_alb_controller_may_read_the_oidc_secret_and_nothing_else():
    role, binding = mp.oidc_secret_reader_role(), mp.oidc_secret_reader_binding(kp.ALB_CONTROLLER_NAMESPACE, kp.ALB_CONTROLLER_SERVICE_ACCOUNT)
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "platform-portal"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [mp.OIDC_SECRET], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "aws-load-balancer-controller", "namespace": "kube-system"}]
    assert kp.alb_controller_values("c", "us-west-2", "vpc-1")["serviceAccount"]["name"] == kp.ALB_CONTROLLER_SERVICE_ACCOUNT
    ingress_oidc = json.loads(mp.ingresses(_portal(), lb_name="x-portal")[0]["metadata"]["annotations"]["alb.ingress.kubernetes.io/auth-idp-oidc"])
    assert ingress_oidc["secretName"] == mp.OIDC_SECRET == mp.oidc_secret("i", "s")["metadata"]["name"]


def test_in_auto_mode_the_group_eks_managed_may_get_the_oidc_secret_and_nothing_else():
    # EKS User Guide, "Grant the EKS Auto Mode load balancer controller access to a specific Secret"
    # (awsdocs/amazon-eks-user-guide latest/ug/automode/auto-managed-rbac-example.adoc, Step 2): a Role
    # of verbs ["get"] on resources ["secrets"] with the Secret's resourceNames, in the Secret's
    # namespace, and a RoleBinding whose subject is "kind: Group, name: eks:managed"
    role, binding = mp.oidc_secret_readers(auto_mode=True, controller_namespace=kp.ALB_CONTROLLER_NAMESPACE, controller_service_account=kp.ALB_CONTROLLER_SERVICE_ACCOUNT)
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "platform-portal" == mp.oidc_secret("i", "s")["metadata"]["namespace"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["portal-oidc"], "verbs": ["get"]}]
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == "platform-portal"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "Group", "name": "eks:managed", "apiGroup": "rbac.authorization.k8s.io"}]
    # the self-managed controller's grant is the one it had, and neither mode gets the other's
    self_managed = mp.oidc_secret_readers(auto_mode=False, controller_namespace=kp.ALB_CONTROLLER_NAMESPACE, controller_service_account=kp.ALB_CONTROLLER_SERVICE_ACCOUNT)
    assert self_managed == [mp.oidc_secret_reader_role(), mp.oidc_secret_reader_binding(kp.ALB_CONTROLLER_NAMESPACE, kp.ALB_CONTROLLER_SERVICE_ACCOUNT)]
    assert {o["metadata"]["name"] for o in self_managed}.isdisjoint({role["metadata"]["name"]})
    import inspect

    src = inspect.getsource(kp.Portal)  # Auto Mode with teams is refused by config today (config/settings.py): no stack renders it
    assert "mp.oidc_secret_readers(auto_mode=not self_managed" in src and "self_managed = s.gpu_pool.mode != \"auto\"" in src


# 2. the guard: identity and size before the body


def _raw(app, method: str, path: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, dict, int]:
    """Call the ASGI app as a server would; returns (status, JSON body, body chunks the app read)."""
    read = 0
    sent: list[dict] = []
    pending = list(chunks)

    async def receive():
        nonlocal read
        if pending:
            read += 1
            body = pending.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pending)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": [(k.lower().encode(), v.encode()) for k, v in {**ALB_FORWARDED, **headers}.items()], "client": ("10.0.0.1", 1), "server": ("portal", 8080)}
    loop = asyncio.new_event_loop()  # its own loop: asyncio.run would leave the thread without one (Pulumi's mocks use the current loop)
    try:
        loop.run_until_complete(app(scope, receive, send))
    finally:
        loop.close()
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), read


def test_a_large_body_without_identity_is_refused_unread():
    app = _app().app
    big = [b"x" * (1 << 20)] * 3
    status, body, read = _raw(app, "POST", "/api/trainjob/upload", {"content-type": "multipart/form-data; boundary=b", "content-length": str(3 << 20)}, big)
    assert (status, body["problems"][0]["field"], read) == (401, "identity", 0)
    status, body, read = _raw(app, "POST", "/api/trainjob/create", {"content-type": "application/json", "authorization": "Bearer forged"}, big)  # chunked, no length
    assert (status, read) == (401, 0)


def test_an_oversized_body_is_refused_by_its_length_unread_and_a_chunked_one_at_the_cap():
    app = _app().app
    who = {"x-amzn-oidc-data": alb_token(), "content-type": "application/json"}
    status, body, read = _raw(app, "POST", "/api/trainjob/create", {**who, "content-length": str(guard.MAX_REQUEST_BYTES + 1)}, [b"{}"])
    assert (status, read) == (413, 0) and str(guard.MAX_REQUEST_BYTES) in body["problems"][0]["problem"]
    chunk = b" " * (1 << 20)
    n = guard.MAX_REQUEST_BYTES // len(chunk) + 2
    status, body, read = _raw(app, "POST", "/api/trainjob/create", who, [chunk] * n)
    assert status == 413 and body["problems"][0]["field"] == "request" and read < n
    status, body, _ = _raw(app, "POST", "/api/trainjob/create", {**who, "content-length": "12x"}, [b"{}"])
    assert status == 400
    assert _app().get("/healthz").status_code == 200  # the probes need no identity


# 3. keep-alive longer than the ALB's idle timeout


def test_the_in_cluster_server_keeps_idle_connections_longer_than_the_alb(monkeypatch, tmp_path):
    import uvicorn
    from kubernetes import config

    doc = mp.settings_document(_portal(), region="us-west-2", signer=ARN, namespaces={"vision": "vision"}, quotas={"vision": None})
    (tmp_path / "p.json").write_text(json.dumps(doc))
    ran = {}
    monkeypatch.setattr(config, "load_incluster_config", lambda client_configuration: None)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(kw))
    assert entry.main(["--config", str(tmp_path / "p.json")]) == 0
    assert ran["timeout_keep_alive"] == entry.KEEP_ALIVE_S and entry.KEEP_ALIVE_S > 60  # the ALB's default idle timeout


# 4. no Service webhook; the portal's objects after the controller


def test_the_charts_service_webhook_is_off_and_the_key_is_the_charts():
    values = kp.alb_controller_values("c", "us-west-2", "vpc-1")
    assert values["enableServiceMutatorWebhook"] is False
    import inspect

    src = inspect.getsource(kp.Portal)
    assert "depends_on=[ns, *serves]" in src and "depends_on=serves" in src  # every portal object waits for the controller's release


# 5. bearer tokens: off unless the stack turns them on


def test_bearer_tokens_are_refused_unless_the_stack_turns_them_on():
    assert PortalSettings().api_bearer_tokens is False
    r = _app().get("/api/trainjobs?namespace=vision", headers={"Authorization": "Bearer abc.def"})
    assert r.status_code == 401 and "apiBearerTokens" in r.text and "abc.def" not in r.text
    on = _app(bearer_tokens=True)
    assert on.get("/api/whoami", headers={"Authorization": "Bearer abc.def"}).json()["via"] == "bearer"
    assert on.get("/", headers={"Authorization": "Bearer abc.def"}).status_code == 401  # pages: the ALB's login only
    doc = mp.settings_document(_portal(apiBearerTokens=True), region="us-west-2", signer=ARN, namespaces={"vision": "vision"}, quotas={"vision": None})
    assert entry.settings_of(doc).bearer_tokens is True
    assert entry.settings_of(mp.settings_document(_portal(), region="us-west-2", signer=ARN, namespaces={"vision": "vision"}, quotas={"vision": None})).bearer_tokens is False


# 6 and 12. verified e-mails only, groups first; the 401 names the claims it saw


def test_an_unverified_email_maps_to_no_team_and_groups_decide_first():
    with pytest.raises(Unauthorized, match="email_verified") as err:
        verifier().caller(alb_token("ana-sub", groups=(), email="ana@example.com", email_verified=False))
    assert "the claims the ALB passed: email, email_verified, exp, groups, sub" in str(err.value) and "ana@example.com" not in str(err.value)
    assert verifier().caller(alb_token("ana-sub", groups=(), email="ana@example.com", email_verified="true")).team == "nlp"
    both = verifier().caller(alb_token("ana-sub", groups=("vision-devs",), email="ana@example.com"))
    assert both.team == "vision"  # her group's team, though her e-mail is nlp's


# 7. ALB names


def test_alb_names_are_valid_and_distinct_for_long_names_and_underscores():
    long_a, long_b = "training-platform-production-us-west-2-a", "training-platform-production-us-west-2-b"
    names = [mp.load_balancer_name(n) for n in (long_a, long_b, "my_cluster", "my-cluster", "training-dev")]
    assert all(len(n) <= 32 and re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?", n) and not n.startswith("internal-") for n in names), names
    assert len(set(names)) == len(names)
    assert names[-1] == "training-dev-portal"  # a name that fits does not change


# 8. the key fetch


def test_key_fetch_failures_are_kept_and_fetches_are_limited_per_minute():
    calls, clock = [], [0.0]

    def fetch(url):
        calls.append(url)
        if url.endswith("/bad"):
            raise OSError("down")
        return "PEM"

    f = KeyFetcher("us-west-2", fetch=fetch, now=lambda: clock[0], per_minute=3, failure_ttl_s=300)
    assert f("good") == "PEM" and f("good") == "PEM" and len(calls) == 1
    for _ in range(3):
        with pytest.raises(KeyUnavailable):
            f("bad")
    assert len(calls) == 2  # the failure is kept
    f("k1")
    with pytest.raises(KeyUnavailable, match="this minute"):
        f("k2")  # 3 fetches this minute already
    assert len(calls) == 3
    clock[0] = 61.0
    assert f("k2") == "PEM" and calls[-1] == "https://public-keys.auth.elb.us-west-2.amazonaws.com/k2"
    clock[0] = 400.0
    with pytest.raises(KeyUnavailable):
        f("bad")
    assert len(calls) == 5  # tried again after the failure's time


def test_an_unfetchable_key_is_a_401():
    from trainctl.portal.identity import AlbIdentity

    def keys(kid):
        raise KeyUnavailable("more than 10 key fetches this minute")

    with pytest.raises(Unauthorized, match="could not be fetched"):
        AlbIdentity(region="us-west-2", alb_arn=ARN, teams=TEAMS, keys=keys).caller(alb_token())


# 9. DELETE


def test_delete_from_another_site_is_refused_and_a_plain_delete_is_not():
    """The seed guide's DELETE has no body and no other header; a browser's request from another
    site says so (Sec-Fetch-Site) and is refused; no CORS preflight is ever granted."""
    c = _app()
    h = {"x-amzn-oidc-data": alb_token()}
    for site in ("cross-site", "same-site"):
        r = c.delete("/api/trainjob/x?namespace=vision", headers={**h, "sec-fetch-site": site})
        assert r.status_code == 401 and "cross-site" in r.text
    r = c.options("/api/trainjob/x?namespace=vision", headers={**h, "origin": "https://evil.example", "access-control-request-method": "DELETE"})
    assert not [k for k in r.headers if k.lower().startswith("access-control-")]
    for extra in ({}, {"sec-fetch-site": "same-origin"}):
        r = c.delete("/api/trainjob/x?namespace=vision", headers={**h, **extra})
        assert r.status_code != 401, r.text  # past the check: the (absent) cluster answers


# 10. readiness gate and preStop


def test_the_namespace_asks_for_the_readiness_gate_and_the_pod_drains_before_it_stops():
    assert mp.namespace_with_readiness_gate()["metadata"]["labels"]["elbv2.k8s.aws/pod-readiness-gate-inject"] == "enabled"
    assert mp.namespace_with_readiness_gate()["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = mp.deployment("img@sha256:0", "h")["spec"]["template"]["spec"]
    assert pod["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": mp.PRESTOP_SLEEP_S}}}
    assert pod["terminationGracePeriodSeconds"] > mp.PRESTOP_SLEEP_S


# 11. partitions


def test_the_portal_is_refused_outside_the_aws_partition_in_one_line():
    portal = _portal()
    assert list(portal_rules(["vision"], portal, region="us-west-2", partition=aws_facts.partition("us-west-2"))) == []
    (err,) = list(portal_rules(["vision"], portal, region="us-gov-west-1", partition=aws_facts.partition("us-gov-west-1")))
    assert err.key == "portal.enabled" and "us-gov-west-1 is in aws-us-gov" in str(err)
    assert list(portal_rules(["vision"], PortalSettings(), region="us-gov-west-1", partition="aws-us-gov")) == []


def test_the_docs_say_where_groups_come_from():
    from config.portal_models import PortalTeamSettings

    assert "userinfo" in (PortalTeamSettings.model_fields["groups"].description or "")
    text = open("docs/trainctl.md").read()
    assert "userinfo" in text and "apiBearerTokens" in text


def _portal(**extra) -> PortalSettings:
    return PortalSettings.model_validate({
        "enabled": True, "host": "portal.example.com", "certificateArn": "arn:aws:acm:us-west-2:123456789012:certificate/12345678-1234-1234-1234-123456789012",
        "issuer": "https://idp.example.com", "authorizationEndpoint": "https://idp.example.com/a", "tokenEndpoint": "https://idp.example.com/t",
        "userInfoEndpoint": "https://idp.example.com/u", "clientId": "c", "clientSecret": "s", "teams": {"vision": {"groups": ["g"]}}, **extra,
    })



def test_the_portal_pods_are_reached_only_from_the_public_subnets_where_the_alb_is():
    """Not from the whole VPC: a host or pod there could write X-Forwarded-For itself and spend the
    key-fetch budget as any number of sources."""
    import copy

    from config.settings import subnet_plan
    from tests.conftest import run_config, stack_file
    from tests.e2e.portal_helpers import PORTAL

    cfg = copy.deepcopy(stack_file("teams")["config"])
    cfg["training-platform:portal"] = copy.deepcopy(PORTAL)
    run = run_config(cfg, stack="teams")
    (policy,) = [r for r in run.registrations if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy" and r.inputs["metadata"]["namespace"] == mp.PORTAL_NAMESPACE and r.inputs["spec"].get("ingress")]
    net = cfg["training-platform:network"]
    public = subnet_plan(net["cidr"], net["azCount"])[1]
    assert [p["ipBlock"]["cidr"] for p in policy.inputs["spec"]["ingress"][0]["from"]] == list(public)
    assert net["cidr"] not in str(policy.inputs["spec"]["ingress"])
