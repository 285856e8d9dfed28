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

import base64
import binascii
import ipaddress
import json
import re
import threading
import time
import urllib.request
from collections import OrderedDict
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

# What the ALB's header looks like (ELB User Guide, "Authenticate users using an Application Load
# Balancer", "User claims encoding and signature verification"): a JWT whose header, payload and
# signature "are base64 URL encoded" (the ALB includes base64 padding, "=": the guide warns that
# "Standard libraries are not compatible with the padding"), signed with "ECDSA + P-256 + SHA256"
# (ES256: a 64-byte r||s signature, RFC 7518 3.4), its JOSE header the fields alg, kid, signer, iss,
# client, exp. Everything here is checked before a key is fetched; only the signature needs the key.
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_-]*={0,2}$", re.ASCII)
ES256_SIGNATURE_BYTES = 64
# The guide: "If the total size of the user claims and access token received from the IdP is greater
# than 11K bytes in size, the load balancer returns an error": claims under 11 KiB are under 15 KiB in
# base64, and the JOSE header and signature add well under 1 KiB.
MAX_OIDC_HEADER_CHARS = 16 * 1024
MAX_JOSE_HEADER_CHARS = 2048  # alg, kid (a UUID), signer (an ARN), iss (a URL), client, exp


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


KEY_FETCHES_PER_MINUTE = 30  # all sources together (the ALB rotates its keys rarely): 15 sources at their budget to spend it
KEY_FETCHES_PER_SOURCE_PER_MINUTE = 2  # one client: below the ceiling, so one source never spends it all
KEY_SOURCES_KEPT = 4096  # the sources whose recent fetches are remembered (the oldest forgotten first)
KEY_FAILURE_TTL_S = 300.0  # a kid whose fetch failed is not fetched again for this long
KEY_FAILURES_KEPT = 1024
KEY_FETCH_TIMEOUT_S = 5
_WINDOW_S = 60.0


class KeyUnavailable(Exception):
    """No public key for a kid (the fetch failed, failed recently, or too many fetches this minute)."""


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=KEY_FETCH_TIMEOUT_S) as resp:  # noqa: S310  (a fixed https URL)
        return resp.read(16384).decode()


class KeyFetcher:
    """The ALB's public keys of one Region by kid: fetched once and kept; a failure kept for
    :data:`KEY_FAILURE_TTL_S`. Fetches are budgeted per minute twice: at most ``per_source`` for
    one client (``source``: :func:`forwarded_source`) and at most ``per_minute`` for all together,
    ``per_source`` below ``per_minute``, so a flood of headers with made-up kids from one client (a
    header's signature can only be checked once its key is known) spends that client's budget and
    leaves fetches for everyone else. A call without a source counts against the ceiling only. A
    refusal for the budget is not a failure of the kid: the same kid is fetched when a budget allows.
    Blocking: the app calls it off the event loop."""

    def __init__(self, region: str, *, fetch: Callable[[str], str] = _http_get, now: Callable[[], float] = time.monotonic,
                 per_minute: int = KEY_FETCHES_PER_MINUTE, per_source: int = KEY_FETCHES_PER_SOURCE_PER_MINUTE,
                 failure_ttl_s: float = KEY_FAILURE_TTL_S, sources_kept: int = KEY_SOURCES_KEPT):
        if not 0 < per_source < per_minute:
            raise ValueError(f"KeyFetcher: per_source ({per_source}) must be at least 1 and below per_minute ({per_minute}), so one source cannot spend every fetch")
        self.region, self._fetch, self._now, self.per_minute, self.per_source, self.failure_ttl_s = region, fetch, now, per_minute, per_source, failure_ttl_s
        self._sources_kept = sources_kept
        self._keys: dict[str, str] = {}
        self._failed: dict[str, float] = {}
        self._recent: list[float] = []
        self._by_source: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, kid: str, source: str | None = None) -> str:
        with self._lock:
            if kid in self._keys:
                return self._keys[kid]
            now = self._now()
            failed = self._failed.get(kid)
            if failed is not None and now - failed < self.failure_ttl_s:
                raise KeyUnavailable(f"the key's fetch failed less than {self.failure_ttl_s:.0f} s ago")
            mine: list[float] = []
            if source is not None:
                mine = [t for t in self._by_source.pop(source, []) if now - t < _WINDOW_S]
                self._by_source[source] = mine  # the most recent source last
                while len(self._by_source) > self._sources_kept:
                    self._by_source.popitem(last=False)
                if len(mine) >= self.per_source:
                    raise KeyUnavailable(f"more than {self.per_source} key fetches this minute from this client")
            self._recent = [t for t in self._recent if now - t < _WINDOW_S]
            if len(self._recent) >= self.per_minute:
                raise KeyUnavailable(f"more than {self.per_minute} key fetches this minute")
            self._recent.append(now)
            mine.append(now)
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


def region_fetcher(region: str) -> KeyFetcher:
    """The process's :class:`KeyFetcher` of ``region`` (one budget and one cache per Region)."""
    with _FETCHERS_LOCK:
        return _FETCHERS.setdefault(region, KeyFetcher(region))


def alb_public_key(region: str, kid: str, source: str | None = None) -> Any:
    """The ALB's public key ``kid`` of ``region`` (PEM), through the Region's :class:`KeyFetcher`."""
    return region_fetcher(region)(kid, source)


def _b64url(segment: str) -> bytes:
    """A base64url segment, with or without the padding the ALB writes; ValueError if it is not one."""
    if not _SEGMENT_RE.fullmatch(segment):
        raise ValueError("not base64url")
    bare = segment.rstrip("=")
    if len(bare) % 4 == 1 or (bare != segment and len(segment) % 4):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(bare + "=" * (-len(bare) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


def unsigned_header(token: str) -> dict[str, Any]:
    """The JOSE header of an ``x-amzn-oidc-data`` value, read without its key, after the value's
    size and structure (three base64url segments, padded or not; a JSON object header) are checked.
    Raises :class:`Unauthorized`."""
    if len(token) > MAX_OIDC_HEADER_CHARS:
        raise Unauthorized(f"the identity header is longer than {MAX_OIDC_HEADER_CHARS} characters")
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1] or len(parts[0]) > MAX_JOSE_HEADER_CHARS:
        raise Unauthorized("the identity header is not a JWT")
    try:
        header = json.loads(_b64url(parts[0]))
        _b64url(parts[1])
        _b64url(parts[2])
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Unauthorized("the identity header is not a JWT") from None
    if not isinstance(header, dict):
        raise Unauthorized("the identity header is not a JWT")
    return header


FORWARDED_FOR = "x-forwarded-for"
FORWARDED_PROTO = "x-forwarded-proto"


def forwarded_source(forwarded_for: list[str], forwarded_proto: str | None) -> str:
    """The client a request came from, as the ALB saw it, for the key-fetch budget; Unauthorized
    where the request did not come through the ALB as the stack deploys it.

    Which address: behind the ALB the TCP peer is one of the ALB's own network interfaces (shared
    by every client), so it cannot tell clients apart. The ALB's ``X-Forwarded-For`` processing
    mode is ``append`` by default (ELB User Guide, "HTTP headers and Application Load Balancers",
    X-Forwarded-For: "The default value for this attribute is append"; k8s/builders/portal.py sets
    no other): it appends the address of the client that connected to it to whatever the client
    sent, so the right-most entry is the ALB's and the only one a client cannot choose; every entry
    left of it is the client's own text. Several header lines are one list in order (RFC 9110 5.3).
    An IPv6 client counts by its /64, which one subscriber usually holds whole.

    The path: the Ingresses listen on HTTPS only, so the ALB's ``X-Forwarded-Proto`` is ``https``."""
    if (forwarded_proto or "").strip().lower() != "https":
        raise Unauthorized("the request did not come through the portal's load balancer (X-Forwarded-Proto is not https)")
    entries = [e.strip() for line in forwarded_for for e in line.split(",")]
    try:
        address = ipaddress.ip_address(entries[-1]) if entries else None
    except ValueError:
        address = None
    if address is None:
        raise Unauthorized("the request did not come through the portal's load balancer (no client address in X-Forwarded-For)")
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class AlbIdentity:
    """Verifies ``x-amzn-oidc-data`` and maps the login to a team."""

    def __init__(self, *, region: str, alb_arn: str, teams: dict[str, TeamLogin], keys: Callable[[str], Any] | KeyFetcher | None = None, now: Callable[[], float] = time.time):
        """``keys``: a :class:`KeyFetcher` (told each request's source), or kid -> key (a test's);
        by default the Region's fetcher of the ALB's keys."""
        self.region, self.alb_arn, self.teams = region, alb_arn, teams
        self._keys = keys if keys is not None else region_fetcher(region)
        self._now = now

    def signer_ok(self, signer: Any) -> bool:
        """The ALB's ARN exactly, or, where only the ARN up to its name is known (``.../app/<name>/``:
        an ALB name is unique per account and Region), that prefix and an ALB id (16 hex digits)."""
        if not isinstance(signer, str) or not self.alb_arn:
            return False
        if self.alb_arn.endswith("/"):
            return signer.startswith(self.alb_arn) and bool(_ALB_ID_RE.fullmatch(signer[len(self.alb_arn):]))
        return signer == self.alb_arn

    def checked_header(self, token: str) -> dict[str, Any]:
        """Every check that needs no key, cheapest first: size, structure and base64, ``alg``,
        ``signer``, ``kid``, the header's ``exp`` and the types of ``iss`` and ``client``. A header
        that fails one never costs a key fetch. Raises :class:`Unauthorized`."""
        header = unsigned_header(token)
        if header.get("alg") != "ES256":
            raise Unauthorized("the identity header is not signed with ES256")
        if not self.signer_ok(header.get("signer")):
            raise Unauthorized("the identity header was not signed by this portal's load balancer")
        kid = header.get("kid")
        if not isinstance(kid, str) or not _KID_RE.fullmatch(kid):
            raise Unauthorized("the identity header names no valid key id")
        exp = header.get("exp")
        if exp is None:
            raise Unauthorized("the identity header has no expiry")
        if not _is_time(exp) or exp + CLOCK_SKEW_S < self._now():
            raise Unauthorized("the identity header has expired")
        iss, client_id = header.get("iss"), header.get("client")
        # iss: the IdP's issuer, which the stack takes only as an https URL (config/portal_models.py)
        if iss is not None and not (isinstance(iss, str) and iss.startswith("https://")):
            raise Unauthorized("the identity header's issuer (iss) is not an https URL")
        if client_id is not None and not isinstance(client_id, str):
            raise Unauthorized("the identity header's client is not a string")
        if len(_b64url(token.split(".")[2])) != ES256_SIGNATURE_BYTES:
            raise Unauthorized(f"the identity header's signature is not {ES256_SIGNATURE_BYTES} bytes (ES256)")
        return header

    def claims(self, token: str, *, source: str | None = None) -> dict[str, Any]:
        """The verified claims. ``source``: the client (:func:`forwarded_source`), whose key-fetch
        budget a new kid spends."""
        header = self.checked_header(token)
        kid = header["kid"]
        try:
            key = self._keys(kid, source) if isinstance(self._keys, KeyFetcher) else self._keys(kid)
        except Exception:  # noqa: BLE001  (no key: no identity)
            raise Unauthorized("the identity header's key could not be fetched") from None
        try:
            claims = jwt.decode(token, key, algorithms=["ES256"], options={"verify_exp": False, "verify_aud": False})
        except jwt.PyJWTError:
            raise Unauthorized("the identity header's signature does not verify") from None
        # the ALB writes exp in the JWT header (checked above); a payload exp (if any) must hold too
        exp = claims.get("exp")
        if exp is not None and (not _is_time(exp) or exp + CLOCK_SKEW_S < self._now()):
            raise Unauthorized("the identity header has expired")
        return claims

    def caller(self, token: str | None, *, team: str | None = None, source: str | None = None) -> Caller:
        if not token:
            raise Unauthorized(f"no {OIDC_HEADER} header: sign in through the portal's address")
        claims = self.claims(token, source=source)
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


def _is_time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
