"""The portal's identity header against a flood of forged ones (issue 42): every check that needs no
key runs before a key is fetched, and the key fetches are budgeted per client (the ALB's
X-Forwarded-For entry) under a global ceiling, so forged headers with random key ids from one client
leave the real key's fetch to everyone else, and to the same kid later."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
from fastapi.testclient import TestClient
from jwt.algorithms import ECAlgorithm
from kubernetes import client

from tests.test_portal import ALB_FORWARDED, ARN, KEY, OTHER_KEY, PUB, TEAMS, alb_token
from trainctl.portal import identity
from trainctl.portal.app import Settings, create_app
from trainctl.portal.identity import AlbIdentity, KeyFetcher, KeyUnavailable, Unauthorized, forwarded_source

REAL_KID = "6f0e2b1c-0000-4000-8000-000000000001"  # alb_token's
FLOOD = 1500  # forged headers per flood; two floods below


def _b64(data: bytes, pad: bool) -> str:
    text = base64.urlsafe_b64encode(data).decode()
    return text if pad else text.rstrip("=")


def alb_style(header: dict, claims: dict, *, key=KEY, pad: bool = True, signature: bytes | None = None) -> str:
    """A header value as the ALB writes it: base64url segments with their padding (ELB User Guide,
    "Authenticate users using an Application Load Balancer", "User claims encoding and signature
    verification": "Standard libraries are not compatible with the padding that is included in the
    Application Load Balancer authentication token in JWT format"), signed ES256 over the segments as sent."""
    signing_input = f"{_b64(json.dumps(header).encode(), pad)}.{_b64(json.dumps(claims).encode(), pad)}"
    sig = signature if signature is not None else ECAlgorithm(ECAlgorithm.SHA256).sign(signing_input.encode(), key)
    return f"{signing_input}.{_b64(sig, pad)}"


def alb_fields(**override) -> dict:
    """The JWT header's fields the guide lists: alg, kid, signer, iss, client, exp."""
    exp = int(time.time()) + 60
    return {"alg": "ES256", "kid": REAL_KID, "signer": ARN, "iss": "https://idp.example.com", "client": "portal-client", "exp": exp, **override}


def counting_keys():
    asked: list[str] = []

    def keys(kid):
        asked.append(kid)
        return PUB

    return asked, keys


# --- the header as AWS documents it ----------------------------------------------------------


def test_a_header_as_the_alb_writes_it_padding_and_all_is_accepted():
    claims = {"sub": "alice", "groups": ["vision-devs"], "exp": int(time.time()) + 60}
    for pad in (True, False):
        token = alb_style(alb_fields(), claims, pad=pad)
        assert token.endswith("==") is pad  # a 64-byte signature: 86 base64 characters and "=="
        assert AlbIdentity(region="us-west-2", alb_arn=ARN, teams=TEAMS, keys=lambda kid: PUB).caller(token).team == "vision"


def _forged(**kw) -> str:
    return alb_style(alb_fields(**kw), {"sub": "mallory", "groups": ["vision-devs"]}, key=OTHER_KEY)


@pytest.mark.parametrize("token,why", [
    (lambda: "a" * (identity.MAX_OIDC_HEADER_CHARS + 1), "longer than"),
    (lambda: "abc.def", "not a JWT"),
    (lambda: _forged().replace(".", "..", 1), "not a JWT"),
    (lambda: "e$J." + _forged().split(".", 1)[1], "not a JWT"),  # not base64url
    (lambda: "eyJhb." + _forged().split(".", 1)[1], "not a JWT"),  # a length no base64 has
    (lambda: _b64(b"[1, 2]", False) + "." + _forged().split(".", 1)[1], "not a JWT"),  # not a JSON object
    (lambda: _b64(b"x" * 3000, False) + "." + _forged().split(".", 1)[1], "not a JWT"),  # a JOSE header of 4 KB
    (lambda: _forged(alg="HS256"), "not signed with ES256"),
    (lambda: _forged(signer=ARN.replace("0123456789abcdef", "fedcba9876543210")), "not signed by this portal's load balancer"),
    (lambda: _forged(kid="../../evil"), "no valid key id"),
    (lambda: _forged(exp=None), "no expiry"),
    (lambda: _forged(exp=int(time.time()) - 120), "expired"),
    (lambda: _forged(exp="tomorrow"), "expired"),
    (lambda: _forged(exp=True), "expired"),
    (lambda: _forged(iss="http://idp.example.com"), "issuer"),
    (lambda: _forged(client=7), "client"),
    (lambda: alb_style(alb_fields(), {"sub": "mallory"}, signature=b"\0" * 63), "not 64 bytes"),
])
def test_a_header_that_fails_a_keyless_check_never_fetches_a_key(token, why):
    asked, keys = counting_keys()
    with pytest.raises(Unauthorized, match=why) as err:
        AlbIdentity(region="us-west-2", alb_arn=ARN, teams=TEAMS, keys=keys).caller(token(), source="203.0.113.9")
    assert asked == [] and "eyJ" not in str(err.value)


def test_a_well_formed_forgery_costs_one_fetch_and_fails_its_signature():
    asked, keys = counting_keys()
    with pytest.raises(Unauthorized, match="signature does not verify"):
        AlbIdentity(region="us-west-2", alb_arn=ARN, teams=TEAMS, keys=keys).caller(_forged(), source="203.0.113.9")
    assert asked == [REAL_KID]


# --- which client ----------------------------------------------------------------------------


def test_the_client_is_the_right_most_forwarded_address_and_the_path_is_the_albs():
    # the ALB appends the address that connected to it (ELB User Guide, "HTTP headers and Application
    # Load Balancers", X-Forwarded-For, processing mode append, the default): what is left of it is the client's text
    assert forwarded_source(["198.51.100.20"], "https") == "198.51.100.20"
    assert forwarded_source(["10.9.9.9, 1.2.3.4, 203.0.113.7"], "https") == "203.0.113.7"
    assert forwarded_source(["10.9.9.9", "203.0.113.7"], "HTTPS") == "203.0.113.7"  # two lines: one list, in order
    assert forwarded_source(["2001:db8:1:2:aaaa::1"], "https") == forwarded_source(["2001:db8:1:2:bbbb::9"], "https") == "2001:db8:1:2::/64"
    assert forwarded_source(["::ffff:203.0.113.7"], "https") == "203.0.113.7"
    for xff, proto in (([], "https"), (["203.0.113.7"], "http"), (["203.0.113.7"], None), (["203.0.113.7, not-an-ip"], "https"), (["203.0.113.7,"], "https")):
        with pytest.raises(Unauthorized, match="did not come through the portal's load balancer"):
            forwarded_source(xff, proto)


def test_the_app_refuses_an_identity_header_that_did_not_come_through_the_alb():
    asked, keys = counting_keys()
    c = TestClient(create_app(_cfg(), _settings(), alb_keys=keys), raise_server_exceptions=False)
    for headers in ({}, {"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-proto": "https"}, {"x-forwarded-proto": "http", "x-forwarded-for": "203.0.113.7"}):
        r = c.get("/api/whoami", headers={"x-amzn-oidc-data": alb_token(), **headers})
        assert r.status_code == 401 and "load balancer" in r.text, headers
    assert asked == []
    assert c.get("/api/whoami", headers={"x-amzn-oidc-data": alb_token(), **ALB_FORWARDED}).json()["team"] == "vision"


# --- the fetcher's budgets -------------------------------------------------------------------


def _fetcher(clock: list[float], fetched: list[str], **kw) -> KeyFetcher:
    def fetch(url):
        fetched.append(url)
        if url.endswith("/" + REAL_KID):
            return PUB
        raise OSError("403")  # what the key endpoint answers for a kid it does not have

    return KeyFetcher("us-west-2", fetch=fetch, now=lambda: clock[0], **kw)


def test_one_source_spends_only_its_own_budget_and_never_the_ceiling():
    clock, fetched = [0.0], []
    f = _fetcher(clock, fetched, per_minute=10, per_source=2)
    for _ in range(50):
        with pytest.raises(KeyUnavailable):
            f(str(uuid.uuid4()), "203.0.113.7")
    assert len(fetched) == 2
    with pytest.raises(KeyUnavailable, match="from this client"):
        f(REAL_KID, "203.0.113.7")
    assert f(REAL_KID, "198.51.100.20") == PUB  # another client: fetched
    assert len(fetched) == 3 and f(REAL_KID, "203.0.113.7") == PUB  # and kept for everyone


def test_a_kid_refused_for_the_budget_is_fetched_later_by_the_same_source():
    clock, fetched = [0.0], []
    f = _fetcher(clock, fetched, per_minute=10, per_source=2)
    for _ in range(2):
        with pytest.raises(KeyUnavailable):
            f(str(uuid.uuid4()), "203.0.113.7")
    with pytest.raises(KeyUnavailable, match="from this client"):
        f(REAL_KID, "203.0.113.7")
    clock[0] = 61.0
    assert f(REAL_KID, "203.0.113.7") == PUB  # the refusal was no failure of the kid


def test_the_global_ceiling_holds_across_sources_and_the_sources_kept_are_bounded():
    clock, fetched = [0.0], []
    f = _fetcher(clock, fetched, per_minute=10, per_source=2, sources_kept=8)
    for i in range(20):
        with pytest.raises(KeyUnavailable):
            f(str(uuid.uuid4()), f"203.0.113.{i}")
    assert len(fetched) == 10  # the ceiling, whoever asks
    with pytest.raises(KeyUnavailable, match="more than 10 key fetches this minute$"):
        f(REAL_KID, "198.51.100.20")
    assert len(f._by_source) <= 8
    with pytest.raises(ValueError, match="per_source"):
        KeyFetcher("us-west-2", per_minute=2, per_source=2)


# --- the flood, through the app ----------------------------------------------------------------


def _cfg() -> client.Configuration:
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"  # nothing listens: no test here reaches a cluster
    return cfg


def _settings() -> Settings:
    return Settings(mode="alb", region="us-west-2", signer=ARN, teams=TEAMS)


def _flood(c: TestClient, source: str, n: int) -> None:
    for _ in range(n):
        r = c.get("/api/whoami", headers={"x-amzn-oidc-data": _forged(kid=str(uuid.uuid4())), "x-forwarded-proto": "https", "x-forwarded-for": f"10.0.0.1, {source}"})
        assert r.status_code == 401


def _whoami(c: TestClient, source: str):
    return c.get("/api/whoami", headers={"x-amzn-oidc-data": alb_token(), "x-forwarded-proto": "https", "x-forwarded-for": f"192.0.2.1, {source}"})


def test_a_flood_of_forged_kids_from_one_client_leaves_the_real_key_to_others_and_to_later():
    # after a restart or a key rotation the real kid is not cached: the flood comes first
    clock, fetched = [0.0], []
    c = TestClient(create_app(_cfg(), _settings(), alb_keys=_fetcher(clock, fetched)), raise_server_exceptions=False)
    _flood(c, "203.0.113.7", FLOOD)
    assert len(fetched) == identity.KEY_FETCHES_PER_SOURCE_PER_MINUTE  # its budget, no more
    r = _whoami(c, "198.51.100.20")  # another client
    assert r.status_code == 200 and r.json()["team"] == "vision"
    assert fetched[-1] == "https://public-keys.auth.elb.us-west-2.amazonaws.com/" + REAL_KID

    # the same client, the same kid, later
    clock, fetched = [0.0], []
    c = TestClient(create_app(_cfg(), _settings(), alb_keys=_fetcher(clock, fetched)), raise_server_exceptions=False)
    _flood(c, "203.0.113.7", FLOOD)
    r = _whoami(c, "203.0.113.7")
    assert r.status_code == 401 and "could not be fetched" in r.text
    clock[0] = 61.0
    assert _whoami(c, "203.0.113.7").json()["team"] == "vision"
    assert fetched.count("https://public-keys.auth.elb.us-west-2.amazonaws.com/" + REAL_KID) == 1
