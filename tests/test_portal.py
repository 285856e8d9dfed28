"""The teams' portal without a cluster: who the caller is (the ALB's signed header: signature, key id,
signer, expiry; a bearer token; the kubeconfig's impersonation), what an upload may hold, every
problem of a submission at once, CSRF on forms and browser changes, escaping, and the stack's
portal objects (impersonation rights exactly the rendered teams', Pod Security restricted, the ALB
controller's IAM policy pinned to its release). The same app against a real API server:
tests/e2e/test_portal.py; in a browser: tests/e2e/test_portal_browser.py."""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import re
import stat
import tarfile
import time
import zipfile

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient
from kubernetes import client

import versions
from config.portal_models import PortalSettings
from k8s.builders import portal as mp
from trainctl.portal import identity, upload
from trainctl.portal.app import Settings, create_app
from trainctl.portal.identity import AlbIdentity, TeamLogin, Unauthorized, kubeconfig_headers
from trainctl.portal.submission import JobSpec, Problems, pick_instance_type, request_of

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARN = "arn:aws:elasticloadbalancing:us-west-2:123456789012:loadbalancer/app/training-teams-portal/0123456789abcdef"
TEAMS = {"vision": TeamLogin("vision", frozenset({"vision-devs"})), "nlp": TeamLogin("nlp", frozenset(), frozenset({"ana@example.com"}))}
# what the ALB adds to every request it forwards (its HTTPS listener; the client's address appended)
ALB_FORWARDED = {"x-forwarded-proto": "https", "x-forwarded-for": "198.51.100.20"}


def keypair():
    key = ec.generate_private_key(ec.SECP256R1())
    return key, key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


KEY, PUB = keypair()
OTHER_KEY, _ = keypair()


def alb_token(sub="alice", *, groups=("vision-devs",), email=None, email_verified: bool | str = True, key=KEY, signer=ARN, kid="6f0e2b1c-0000-4000-8000-000000000001", exp_in=60, alg="ES256") -> str:
    exp = int(time.time()) + exp_in
    claims = {"sub": sub, "groups": list(groups), "exp": exp, **({"email": email, "email_verified": email_verified} if email else {})}
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid, "signer": signer, "exp": exp})


def verifier(**kw) -> AlbIdentity:
    return AlbIdentity(region="us-west-2", alb_arn=ARN, teams=TEAMS, keys=lambda kid: PUB, **kw)


def test_a_login_signed_by_this_alb_acts_as_its_team_through_impersonation():
    caller = verifier().caller(alb_token())
    assert (caller.team, caller.namespace, caller.via) == ("vision", "vision", "alb")
    assert caller.headers == {"Impersonate-User": ["portal:vision"], "Impersonate-Group": ["training-platform:team:vision"], "Impersonate-Extra-portal-subject": ["alice"]}
    by_email = verifier().caller(alb_token("ana-sub", groups=(), email="Ana@Example.com"))
    assert by_email.team == "nlp" and by_email.headers["Impersonate-Group"] == ["training-platform:team:nlp"]


@pytest.mark.parametrize("token,why", [
    (lambda: None, "no x-amzn-oidc-data"),
    (lambda: "not-a-jwt", "not a JWT"),
    (lambda: alb_token(key=OTHER_KEY), "signature does not verify"),
    (lambda: alb_token(signer=ARN.replace("0123456789abcdef", "fedcba9876543210")), "not signed by this portal's load balancer"),
    (lambda: alb_token(signer="arn:aws:elasticloadbalancing:us-west-2:999999999999:loadbalancer/app/other/0123456789abcdef"), "not signed by this portal's load balancer"),
    (lambda: alb_token(exp_in=-120), "expired"),
    (lambda: alb_token(kid="../../evil"), "no valid key id"),
    (lambda: alb_token(groups=("marketing",)), "belongs to no team"),
    (lambda: alb_token(sub="a\nb"), "no usable subject"),
])
def test_forged_expired_foreign_and_teamless_headers_are_refused(token, why):
    with pytest.raises(Unauthorized, match=why):  # (tokens made when the test runs: they expire in a minute)
        verifier().caller(token())


def test_an_unsigned_header_is_refused():
    header = jwt.utils.base64url_encode(json.dumps({"alg": "none", "signer": ARN, "kid": "k", "exp": time.time() + 60}).encode()).decode()
    body = jwt.utils.base64url_encode(json.dumps({"sub": "alice", "groups": ["vision-devs"]}).encode()).decode()
    with pytest.raises(Unauthorized, match="not signed with ES256"):
        verifier().caller(f"{header}.{body}.")


def test_the_signer_may_be_given_up_to_the_albs_name():
    prefix = mp.signer_prefix("aws", "us-west-2", "123456789012", "training-teams-portal")
    v = AlbIdentity(region="us-west-2", alb_arn=prefix, teams=TEAMS, keys=lambda kid: PUB)
    assert v.caller(alb_token()).team == "vision"
    for other in (prefix + "0123/extra", prefix[:-1] + "x/0123456789abcdef", prefix):
        with pytest.raises(Unauthorized):
            v.caller(alb_token(signer=other))


def test_the_production_key_source_is_the_regions_alb_endpoint_and_not_configurable():
    assert identity.KEY_URL.format(region="eu-west-1", kid="abc") == "https://public-keys.auth.elb.eu-west-1.amazonaws.com/abc"
    import inspect

    from trainctl.portal import __main__ as entry

    # the in-cluster entry point builds the app without keys: the ALB's, fetched by kid
    assert "alb_keys" not in inspect.getsource(entry.main)


def test_kubeconfig_impersonation_fields_become_request_headers():
    user = {"as": "jane", "as-uid": "42", "as-groups": ["a", "b"], "as-user-extra": {"scopes": ["x", "y"]}}
    assert kubeconfig_headers(user) == {"Impersonate-User": ["jane"], "Impersonate-Uid": ["42"], "Impersonate-Group": ["a", "b"], "Impersonate-Extra-scopes": ["x", "y"]}


def test_several_groups_are_sent_as_several_headers(monkeypatch):
    from trainctl.kube import KubeApi

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:1"
    api = KubeApi(namespace="vision", configuration=cfg, headers={"Impersonate-Group": ["a", "b"], "Impersonate-User": ["u"]})
    sent = {}

    def fake(method, url, headers=None, **kw):
        sent["headers"] = headers
        raise OSError("stop")

    monkeypatch.setattr(api.api.rest_client.pool_manager, "_inner", type("P", (), {"request": staticmethod(fake)})())
    with pytest.raises(Exception):  # noqa: B017
        api.list_trainjobs()
    assert sent["headers"].getlist("Impersonate-Group") == ["a", "b"]
    with pytest.raises(Exception, match="no call through the Kubeflow SDK"):
        _ = api.trainer


# --- uploads -------------------------------------------------------------------------------------


def _zip(entries: list[tuple[str, bytes, int | None]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return buf.getvalue()


def _tar(members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None, mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for m in members:
            tf.addfile(m, io.BytesIO((data or {}).get(m.name, b"")) if m.isreg() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.size, m.linkname = kind, size, link
    return m


def test_files_and_archives_unpack_inside_the_directory(tmp_path):
    upload.unpack([upload.Part("train.py", b"print(1)\n"), upload.Part("conf/a.yaml", b"x: 1\n")], tmp_path / "a")
    assert sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*") if p.is_file()) == ["conf/a.yaml", "train.py"]
    upload.unpack([upload.Part("code.zip", _zip([("proj/train.py", b"print(1)\n", None)]))], tmp_path / "b")
    assert (tmp_path / "b/proj/train.py").read_text() == "print(1)\n"
    upload.unpack([upload.Part("code.tar.gz", _tar([_member("train.py", size=9)], {"train.py": b"print(1)\n"}))], tmp_path / "c")
    assert (tmp_path / "c/train.py").is_file()


@pytest.mark.parametrize("parts,why", [
    ([upload.Part("/etc/passwd", b"x")], "not a relative path"),
    ([upload.Part("../escape.py", b"x")], "not a relative path"),
    ([upload.Part("a\\b.py", b"x")], "not a relative path"),
    ([upload.Part("code.zip", _zip([("../../evil.py", b"x", None)]))], "not a relative path"),
    ([upload.Part("code.zip", _zip([("/abs.py", b"x", None)]))], "not a relative path"),
    ([upload.Part("code.zip", _zip([("link", b"/etc/passwd", stat.S_IFLNK | 0o777)]))], "not a regular file"),
    ([upload.Part("code.tar", _tar([_member("link", tarfile.SYMTYPE, link="/etc/passwd")], mode="w"))], "not a regular file"),
    ([upload.Part("code.tar", _tar([_member("hard", tarfile.LNKTYPE, link="/etc/shadow")], mode="w"))], "not a regular file"),
    ([upload.Part("code.tar.gz", _tar([_member("dev", tarfile.CHRTYPE)]))], "not a regular file"),
    ([upload.Part("code.tar.gz", _tar([_member("fifo", tarfile.FIFOTYPE)]))], "not a regular file"),
    ([upload.Part("code.tar.gz", _tar([_member("../x.py", size=1)], {"../x.py": b"x"}))], "not a relative path"),
    ([upload.Part("code.zip", _zip([("bomb.bin", b"\0" * (upload.MAX_BYTES + 1), None)]))], "more than"),
    ([upload.Part("code.tar.gz", _tar([_member("bomb.bin", size=upload.MAX_BYTES + 1)], {"bomb.bin": b"\0" * (upload.MAX_BYTES + 1)}))], "more than"),
    ([upload.Part("code.zip", b"PK\x03\x04garbage")], "not a valid zip"),
    ([upload.Part("train.py", "print('é')".encode("latin-1"))], "not UTF-8"),
    ([upload.Part("a.py", b"x"), upload.Part("b.zip", _zip([("c.py", b"x", None)]))], "not both"),
    ([upload.Part(f"f{i}.txt", b"x") for i in range(upload.MAX_FILES + 1)], f"more than {upload.MAX_FILES} files"),
])
def test_bad_uploads_are_refused_and_nothing_lands_outside(tmp_path, parts, why):
    dest = tmp_path / "upload"
    dest.mkdir()
    with pytest.raises(upload.UploadError, match=why):
        upload.unpack(parts, dest)
    assert [p.name for p in tmp_path.iterdir()] == ["upload"]


def test_a_zip_that_lies_about_its_size_stops_at_the_limit(tmp_path):
    data = bytearray(_zip([("big.bin", b"\0" * (upload.MAX_BYTES + 10), None)]))
    # rewrite the declared size in the central directory and local header to 10 bytes
    real = (upload.MAX_BYTES + 10).to_bytes(4, "little")
    data = bytes(data).replace(real, (10).to_bytes(4, "little"))
    with pytest.raises(upload.UploadError):
        upload.unpack([upload.Part("code.zip", data)], tmp_path)


# --- a submission's problems, all at once ------------------------------------------------------


def test_every_problem_of_a_submission_is_named_by_its_field():
    spec = JobSpec(namespace="Bad NS", framework="mpi", num_nodes=0, gpu_per_node="two", cpu_per_node=-1, memory_per_node=10**9, image="latest-less", name="Bad_Name", command="python 'unclosed")
    with pytest.raises(Problems) as err:
        request_of(spec, None)
    fields = [p["field"] for p in err.value.problems]
    for field in ("framework", "config.num_nodes", "config.gpu_per_node", "config.cpu_per_node", "config.memory_per_node", "command", "image", "name", "namespace"):
        assert field in fields, (field, err.value.problems)


def test_the_seed_guides_resources_choose_the_smallest_instance_type_that_gives_them():
    assert pick_instance_type(1, 4, 16, ["g5.xlarge", "g5.2xlarge", "g5.12xlarge"]) == "g5.2xlarge"  # g5.xlarge's pod gets 1 CPU
    assert pick_instance_type(4, 16, 64, ["g5.xlarge", "g5.12xlarge"]) == "g5.12xlarge"
    assert pick_instance_type(8, None, None, ["g5.xlarge", "g5.12xlarge"]) is None
    with pytest.raises(Problems, match="no GPU instance type"):
        request_of(JobSpec(namespace="vision", framework="pytorch", num_nodes=1, gpu_per_node=1, cpu_per_node=64), {"pools": [{"instanceTypes": ["g5.xlarge"], "efa": False}]})


# --- the app: 401s, CSRF, escaping, no traceback ----------------------------------------------------


@pytest.fixture
def app_client():
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"  # nothing listens: no test here reaches a cluster
    app = create_app(cfg, Settings(mode="alb", region="us-west-2", signer=ARN, teams=TEAMS), alb_keys=lambda kid: PUB)
    return TestClient(app, raise_server_exceptions=False, headers=ALB_FORWARDED)


@pytest.mark.parametrize("path", ["/api/trainjobs?namespace=vision", "/api/trainjob/x/status?namespace=vision", "/", "/submit", "/api/team"])
def test_every_route_needs_a_valid_identity(app_client, path):
    for headers in ({}, {"x-amzn-oidc-data": alb_token(key=OTHER_KEY)}, {"x-amzn-oidc-data": alb_token(exp_in=-100)}):
        r = app_client.get(path, headers=headers)
        assert r.status_code == 401 and r.json()["problems"][0]["field"] == "identity"
        assert "Traceback" not in r.text and "eyJ" not in r.text  # no token echoed


def test_the_health_check_needs_no_identity(app_client):
    assert app_client.get("/healthz").json() == {"status": "ok"}


def test_browser_changes_need_json_or_the_csrf_token(app_client):
    h = {"x-amzn-oidc-data": alb_token()}
    body = json.dumps({"namespace": "vision", "framework": "pytorch", "training_code": "print(1)", "config": {"num_nodes": 1, "gpu_per_node": 1}}).encode()
    # what a cross-site form can send (text/plain, no custom header): refused before any cluster call (which would answer 502 here)
    r = app_client.post("/api/trainjob/create", headers={**h, "content-type": "text/plain"}, content=body)
    assert r.status_code in (401, 422), r.text
    r = app_client.post("/api/trainjob/upload", headers=h, files={"files": ("train.py", b"print(1)")}, data={"namespace": "vision", "framework": "pytorch", "num_nodes": "1", "gpu_per_node": "1"})
    assert r.status_code == 401 and "cross-site" in r.text
    r = app_client.post("/submit", headers=h, data={"framework": "pytorch", "num_nodes": "1"})
    assert r.status_code == 401 and "CSRF" in r.text
    r = app_client.post("/jobs/x/cancel", headers=h, data={"csrf": "0" * 64})
    assert r.status_code == 401


def test_a_form_with_three_mistakes_shows_three_messages_and_creates_nothing(app_client):
    h = {"x-amzn-oidc-data": alb_token()}
    page = app_client.get("/submit", headers=h).text
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
    r = app_client.post("/submit", headers=h, data={"csrf": token, "framework": "pytorch", "num_nodes": "0", "preset": "custom", "gpu_per_node": "x", "cpu_per_node": "", "memory_per_node": "",
                                                    "image_choice": "custom", "image": "nope", "command": "python train.py", "training_code": "print(1)"})
    assert r.status_code == 422
    assert len(re.findall(r'class="field-error"', r.text)) == 3, r.text


def test_bad_json_is_one_problem_per_field_without_a_traceback(app_client):
    h = {"x-amzn-oidc-data": alb_token()}
    r = app_client.post("/api/trainjob/create", headers=h, json={"namespace": "vision", "framework": "pytorch", "training_code": "x", "config": {"num_nodes": "a", "gpu_per_node": 1, "x": 1}, "extra": 1})
    assert r.status_code == 422
    assert {p["field"] for p in r.json()["problems"]} == {"config.num_nodes", "config.x", "extra"}
    r = app_client.post("/api/trainjob/create", headers=h, json={"namespace": "nlp", "framework": "jax", "training_code": "x", "config": {"num_nodes": 2000, "gpu_per_node": 0}, "user_id": "mallory"})
    assert {p["field"] for p in r.json()["problems"]} == {"user_id", "namespace", "framework", "config.num_nodes", "config.gpu_per_node"}


def test_job_values_are_escaped_in_pages():
    from trainctl.portal.pages import templates

    evil = "<script>alert(1)</script>"
    html = templates.get_template("job.html").render(
        caller=identity.Caller(name=evil, namespace="vision"), namespace="vision", csrf="t", notice=None, findings=[{"cause": evil, "hint": evil, "evidence": [evil]}],
        events=[{"time": "t", "type": "Warning", "reason": evil, "object": evil, "message": evil}],
        job={"trainjob_name": "j", "status": "Failed", "message": evil, "nodes": 1, "gpus": 1, "progress_text": "-", "restarts": 0, "created_at": "t", "workers": [{"worker": 0, "pod": evil, "phase": evil, "waiting": None, "restarts": 0}]},
    )
    assert evil not in html and "&lt;script&gt;" in html


# --- the stack's objects -----------------------------------------------------------------------------


def test_the_impersonation_role_names_exactly_the_teams_and_nothing_else():
    role = mp.impersonator_role(["vision", "nlp"])
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["portal:vision", "portal:nlp"]},
        {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": ["training-platform:team:vision", "training-platform:team:nlp"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": [f"userextras/{identity.SUBJECT_EXTRA}"], "verbs": ["impersonate"]},
    ]
    assert mp.SUBJECT_EXTRA == identity.SUBJECT_EXTRA and mp.portal_user("x") == identity.portal_user("x")
    assert not any(n.startswith("system:") for r in role["rules"] for n in r.get("resourceNames", []))


def test_the_portal_pod_meets_pod_security_restricted():
    dep = mp.deployment("img@sha256:0", "h")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["allowPrivilegeEscalation"] is False and c["capabilities"] == {"drop": ["ALL"]} and c["readOnlyRootFilesystem"] is True
    assert {v["name"]: next(k for k in v if k != "name") for v in pod["volumes"]} == {"config": "configMap", "tmp": "emptyDir"}
    assert mp.namespace()["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_ingresses_put_the_pages_behind_login_and_the_api_beside_it():
    portal = PortalSettings.model_validate({"enabled": True, "host": "portal.example.com", "certificateArn": "arn:aws:acm:us-west-2:123456789012:certificate/12345678-1234-1234-1234-123456789012",
                                            "issuer": "https://idp.example.com", "authorizationEndpoint": "https://idp.example.com/a", "tokenEndpoint": "https://idp.example.com/t",
                                            "userInfoEndpoint": "https://idp.example.com/u", "clientId": "c", "clientSecret": "s", "teams": {"vision": {"groups": ["g"]}}})
    api, pages = mp.ingresses(portal, lb_name="training-teams-portal")
    ann = pages["metadata"]["annotations"]
    assert ann["alb.ingress.kubernetes.io/auth-on-unauthenticated-request"] == "authenticate" and api["metadata"]["annotations"]["alb.ingress.kubernetes.io/auth-on-unauthenticated-request"] == "allow"
    assert json.loads(ann["alb.ingress.kubernetes.io/auth-idp-oidc"])["secretName"] == mp.OIDC_SECRET and "s" not in ann["alb.ingress.kubernetes.io/auth-idp-oidc"].split('"')
    assert len(mp.load_balancer_name("a" * 100)) <= mp.LB_NAME_MAX
    # the key-fetch budget counts by X-Forwarded-For's right-most entry: the ALB must append to it, on both
    # Ingresses of the group alike (the controller refuses differing attributes within one group)
    assert {i["metadata"]["annotations"]["alb.ingress.kubernetes.io/load-balancer-attributes"] for i in (api, pages)} == {"routing.http.xff_header_processing.mode=append"}


def test_the_alb_controllers_iam_policy_is_its_releases_file():
    text = (ROOT / "config/alb_controller_iam_policy.json").read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == versions.ALB_CONTROLLER_IAM_POLICY_SHA256
    assert versions.ALB_CONTROLLER_IAM_POLICY_SOURCE == f"https://raw.githubusercontent.com/kubernetes-sigs/aws-load-balancer-controller/v{versions.ALB_CONTROLLER_VERSION}/docs/install/iam_policy.json"
    doc = json.loads(text)
    assert doc["Version"] == "2012-10-17" and any("elasticloadbalancing:CreateLoadBalancer" in s.get("Action", []) for s in doc["Statement"])


def test_the_image_is_pinned_and_its_requirements_agree_with_the_projects():
    dockerfile = (ROOT / "portal/Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={versions.PORTAL_BASE_IMAGE}\n" in dockerfile and f"ARG PORTAL_UID={versions.PORTAL_UID}\n" in dockerfile
    pins = {line.split("==")[0].lower(): line for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line and not line.startswith("#")}
    for line in (ROOT / "portal/requirements.txt").read_text().splitlines():
        if "==" in line:
            assert pins[line.split("==")[0].lower()].split()[0] == line, line


def test_a_client_leaving_a_live_log_stream_does_not_stop_the_portal():
    """Closing a followed log that another thread is reading blocks until that read returns; the
    portal hangs up off its event loop, so the next request is answered at once."""
    import threading

    from trainctl.portal.identity import Caller

    blocked = threading.Event()

    class FollowedLog:  # a live container's log: one line, then nothing for a long time
        def stream(self, n):
            yield b"first line\n"
            blocked.wait(60)

        def release_conn(self):
            pass

        def close(self):  # as urllib3's close does while another thread reads
            blocked.wait(60)

    class Kube:
        def pod_log(self, pod, follow):
            return FollowedLog()

    pod = {"metadata": {"name": "j-node-0-0-x"}, "status": {"phase": "Running", "containerStatuses": [{"state": {"running": {"startedAt": "t"}}}]}}
    tj = {"metadata": {"name": "j", "labels": {}}, "spec": {"trainer": {"numNodes": 1}}, "status": {"jobsStatus": [{"active": 1}]}}
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    app = create_app(cfg, Settings(mode="local", local_caller=Caller(name="me", namespace="vision")))
    app.state.portal.worker_pod = lambda *a, **k: (Kube(), tj, pod)
    try:
        with TestClient(app) as c:
            with c.stream("GET", "/api/trainjob/j/logs/stream", params={"worker": 0}) as r:
                for line in r.iter_lines():
                    if line == "data: first line":
                        break
            t0 = time.monotonic()
            assert c.get("/healthz").status_code == 200
            assert time.monotonic() - t0 < 5
    finally:
        blocked.set()


def test_trainctl_ui_serves_as_the_kubeconfigs_identity_and_only_on_its_own_address(tmp_path):
    import yaml

    from trainctl import ui

    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t", "as": "jane", "as-groups": ["training-platform:team:vision", "extra"]}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "vision"}}],
    }))
    app, url = ui.build(str(kc), None, None, 8799)
    assert url == "http://127.0.0.1:8799/"
    caller = app.state.settings.local_caller
    assert (caller.namespace, caller.name) == ("vision", "jane")
    assert caller.headers == {"Impersonate-User": ["jane"], "Impersonate-Group": ["training-platform:team:vision", "extra"]}
    assert app.state.portal.kube(caller, "vision").headers == caller.headers  # every call carries them
    # another Host (a page elsewhere pointing a name of its own at 127.0.0.1) is refused
    assert TestClient(app, base_url="http://evil.example:8799").get("/api/whoami").status_code == 401
    assert TestClient(app, base_url="http://127.0.0.1:8799").get("/api/whoami").json()["name"] == "jane"
