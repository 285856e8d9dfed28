"""Who the caller is, and as whom the portal calls the API server.

Three ways, one per way the portal runs:

* **Behind the ALB** (in the cluster): the ALB's OIDC action signs the IdP's user claims into the
  ``x-amzn-oidc-data`` header, a JWT signed with ES256 whose *header* carries ``kid``, ``signer``
  (the ALB's ARN) and ``exp`` (AWS, Elastic Load Balancing User Guide, "Authenticate users using an
  Application Load Balancer", section "User claims encoding and signature verification": fetch the
  public key from ``https://public-keys.auth.elb.<region>.amazonaws.com/<kid>``, check ``signer``).
  The login's groups or e-mail map to one team of the stack (``portal.teams``); the portal then
  calls the API server as ``portal:<team>`` in the team's group, with the login's subject as a user
  extra (:data:`SUBJECT_EXTRA`), which the API server's audit log records. Its service account may
  impersonate exactly those users and groups (k8s/builders/portal.py), so the API server, with the
  team's RBAC, admission policy, Pod Security and Kueue, decides everything.
* **A Kubernetes bearer token** on ``/api/*`` (a team's own backend), only where the stack turns
  it on (``portal.apiBearerTokens``, off by default: it makes the ALB a public door to the private
  API server for whoever holds a token): passed to the API server unchanged, which authenticates it.
* **On a laptop** (``trainctl ui``): the kubeconfig's own identity, its impersonation fields
  (``as``, ``as-groups``, ``as-uid``, ``as-user-extra``) included.

The production key source is :func:`alb_public_key`; a test gives another through the app factory's
``alb_keys`` argument (code, never configuration or environment).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jwt

from k8s.builders.tenants import team_group

OIDC_HEADER = "x-amzn-oidc-data"
SUBJECT_EXTRA = "portal-subject"
"""The user-extra key (``Impersonate-Extra-portal-subject``) that carries the login's subject."""
KEY_URL = "https://public-keys.auth.elb.{region}.amazonaws.com/{kid}"
# kid: a key id the ALB writes (a UUID); anything else is refused before it reaches a URL
_KID_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$", re.ASCII)
# a header value the API server takes as is: printable ASCII, no spaces at the ends
_HEADER_VALUE_RE = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]{0,254}[\x21-\x7e])?$", re.ASCII)
CLOCK_SKEW_S = 30
_ALB_ID_RE = re.compile(r"^[0-9a-f]{16}$", re.ASCII)


class Unauthorized(Exception):
    """No valid identity (HTTP 401); the message names what was wrong, never a token."""


def portal_user(team: str) -> str:
    """The user the portal impersonates for a team's member (exactly these may be impersonated)."""
    return f"portal:{team}"


@dataclass(frozen=True)
class TeamLogin:
    """Who belongs to a team (stack config ``portal.teams.<team>``) and its namespace."""

    namespace: str
    groups: frozenset[str] = frozenset()
    emails: frozenset[str] = frozenset()
    gpu_quota: int | None = None


@dataclass(frozen=True)
class Caller:
    """The caller of one request. ``headers``: what every API call on their behalf sends
    (impersonation); ``token``: a bearer token passed through; both empty on a laptop."""

    name: str
    namespace: str | None
    team: str | None = None
    headers: dict[str, list[str]] = field(default_factory=dict)
    token: str | None = None
    via: str = "kubeconfig"  # alb | bearer | kubeconfig | local (trainctl ui --local)
    gpu_quota: int | None = None


KEY_FETCHES_PER_MINUTE = 10  # the ALB rotates its keys rarely; a flood of made-up kids gets no more
KEY_FAILURE_TTL_S = 300.0  # a kid whose fetch failed is not fetched again for this long
KEY_FAILURES_KEPT = 1024
KEY_FETCH_TIMEOUT_S = 5


class KeyUnavailable(Exception):
    """No public key for a kid (the fetch failed, failed recently, or too many fetches this minute)."""


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=KEY_FETCH_TIMEOUT_S) as resp:  # noqa: S310  (a fixed https URL)
        return resp.read(16384).decode()


class KeyFetcher:
    """The ALB's public keys of one Region by kid: fetched once and kept; a failure kept for
    :data:`KEY_FAILURE_TTL_S`; at most :data:`KEY_FETCHES_PER_MINUTE` fetches a minute, so headers
    with random kids (their signature is checked only after the key is known) cannot keep the
    portal waiting on the key endpoint. Blocking: the app calls it off the event loop."""

    def __init__(self, region: str, *, fetch: Callable[[str], str] = _http_get, now: Callable[[], float] = time.monotonic,
                 per_minute: int = KEY_FETCHES_PER_MINUTE, failure_ttl_s: float = KEY_FAILURE_TTL_S):
        self.region, self._fetch, self._now, self.per_minute, self.failure_ttl_s = region, fetch, now, per_minute, failure_ttl_s
        self._keys: dict[str, str] = {}
        self._failed: dict[str, float] = {}
        self._recent: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, kid: str) -> str:
        with self._lock:
            if kid in self._keys:
                return self._keys[kid]
            now = self._now()
            failed = self._failed.get(kid)
            if failed is not None and now - failed < self.failure_ttl_s:
                raise KeyUnavailable(f"the key's fetch failed less than {self.failure_ttl_s:.0f} s ago")
            self._recent = [t for t in self._recent if now - t < 60.0]
            if len(self._recent) >= self.per_minute:
                raise KeyUnavailable(f"more than {self.per_minute} key fetches this minute")
            self._recent.append(now)
        try:
            pem = self._fetch(KEY_URL.format(region=self.region, kid=kid))
        except Exception as err:
            with self._lock:
                self._failed.pop(kid, None)
                self._failed[kid] = self._now()
                while len(self._failed) > KEY_FAILURES_KEPT:
                    self._failed.pop(next(iter(self._failed)))
            raise KeyUnavailable(f"the key's fetch failed ({type(err).__name__})") from None
        with self._lock:
            self._keys[kid] = pem
        return pem


_FETCHERS: dict[str, KeyFetcher] = {}
_FETCHERS_LOCK = threading.Lock()


def alb_public_key(region: str, kid: str) -> Any:
    """The ALB's public key ``kid`` of ``region`` (PEM), through the Region's :class:`KeyFetcher`."""
    with _FETCHERS_LOCK:
        fetcher = _FETCHERS.setdefault(region, KeyFetcher(region))
    return fetcher(kid)


class AlbIdentity:
    """Verifies ``x-amzn-oidc-data`` and maps the login to a team."""

    def __init__(self, *, region: str, alb_arn: str, teams: dict[str, TeamLogin], keys: Callable[[str], Any] | None = None, now: Callable[[], float] = time.time):
        self.region, self.alb_arn, self.teams = region, alb_arn, teams
        self._keys = keys if keys is not None else (lambda kid: alb_public_key(region, kid))
        self._now = now

    def signer_ok(self, signer: Any) -> bool:
        """The ALB's ARN exactly, or, where only the ARN up to its name is known (``.../app/<name>/``:
        an ALB name is unique per account and Region), that prefix and an ALB id (16 hex digits)."""
        if not isinstance(signer, str) or not self.alb_arn:
            return False
        if self.alb_arn.endswith("/"):
            return signer.startswith(self.alb_arn) and bool(_ALB_ID_RE.fullmatch(signer[len(self.alb_arn):]))
        return signer == self.alb_arn

    def claims(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthorized("the identity header is not a JWT") from None
        if header.get("alg") != "ES256":
            raise Unauthorized("the identity header is not signed with ES256")
        if not self.signer_ok(header.get("signer")):
            raise Unauthorized("the identity header was not signed by this portal's load balancer")
        kid = header.get("kid")
        if not isinstance(kid, str) or not _KID_RE.fullmatch(kid):
            raise Unauthorized("the identity header names no valid key id")
        try:
            key = self._keys(kid)
        except Exception:  # noqa: BLE001  (no key: no identity)
            raise Unauthorized("the identity header's key could not be fetched") from None
        try:
            claims = jwt.decode(token, key, algorithms=["ES256"], options={"verify_exp": False, "verify_aud": False})
        except jwt.PyJWTError:
            raise Unauthorized("the identity header's signature does not verify") from None
        # the ALB writes exp in the JWT header; a payload exp (if any) must hold too
        now = self._now()
        for where, exp in (("header", header.get("exp")), ("claims", claims.get("exp"))):
            if where == "header" and exp is None:
                raise Unauthorized("the identity header has no expiry")
            if exp is not None and (not isinstance(exp, int | float) or exp + CLOCK_SKEW_S < now):
                raise Unauthorized("the identity header has expired")
        return claims

    def caller(self, token: str | None, *, team: str | None = None) -> Caller:
        if not token:
            raise Unauthorized(f"no {OIDC_HEADER} header: sign in through the portal's address")
        claims = self.claims(token)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not _HEADER_VALUE_RE.fullmatch(subject):
            raise Unauthorized("the login has no usable subject")
        email = verified_email(claims)
        groups = claims.get("groups") or []
        groups = {groups} if isinstance(groups, str) else {g for g in groups if isinstance(g, str)} if isinstance(groups, list) else set()
        by_group = sorted(t for t, login in self.teams.items() if groups & login.groups)
        # groups first: an e-mail decides only where no group does
        mine = by_group or sorted(t for t, login in self.teams.items() if email is not None and email.lower() in login.emails)
        if not mine:
            keys = ", ".join(sorted(str(k)[:40] for k in claims)[:30]) or "none"
            why = "" if email is not None or not isinstance(claims.get("email"), str) else " (its email is not verified: email_verified is not true)"
            raise Unauthorized(f"your login belongs to no team of this platform (portal.teams){why}; the claims the ALB passed: {keys} "
                               "(groups come only from the IdP's userinfo endpoint): ask the platform team")
        chosen = team if team in mine else mine[0]
        login = self.teams[chosen]
        headers = {"Impersonate-User": [portal_user(chosen)], "Impersonate-Group": [team_group(chosen)], f"Impersonate-Extra-{SUBJECT_EXTRA}": [subject]}
        return Caller(name=email or subject, namespace=login.namespace, team=chosen, headers=headers, via="alb", gpu_quota=login.gpu_quota)


def verified_email(claims: dict[str, Any]) -> str | None:
    """The login's e-mail where the IdP says it verified it (OpenID Connect Core 1.0, 5.1 Standard
    Claims: ``email_verified``, a boolean; some userinfo endpoints send the string "true"), else None:
    an unverified address may be anyone's."""
    email = claims.get("email")
    if not isinstance(email, str) or claims.get("email_verified") not in (True, "true"):
        return None
    return email


_BEARER_RE = re.compile(r"^Bearer ([\x21-\x7e]{1,8192})$", re.ASCII)


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    m = _BEARER_RE.fullmatch(authorization or "")
    return m.group(1) if m else None


def kubeconfig_headers(user: dict[str, Any]) -> dict[str, list[str]]:
    """The impersonation a kubeconfig user asks for (``as``, ``as-uid``, ``as-groups``,
    ``as-user-extra``: client-go ``tools/clientcmd/api/v1`` AuthInfo), as request headers
    (k8s.io/apiserver ``pkg/authentication/user`` impersonation headers)."""
    headers: dict[str, list[str]] = {}
    if user.get("as"):
        headers["Impersonate-User"] = [str(user["as"])]
    if user.get("as-uid"):
        headers["Impersonate-Uid"] = [str(user["as-uid"])]
    if user.get("as-groups"):
        headers["Impersonate-Group"] = [str(g) for g in user["as-groups"]]
    for key, values in (user.get("as-user-extra") or {}).items():
        headers[f"Impersonate-Extra-{key}"] = [str(v) for v in values]
    return headers
