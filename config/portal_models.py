"""The teams' portal (``training-platform:portal``): the web page and API of trainctl/portal behind an
ALB with OIDC login (k8s/builders/portal.py, k8s/portal.py). Off by default."""

from __future__ import annotations

import re
from collections.abc import Iterator

from config.checks import _cidr_list, _pattern, duplicate_errors
from config.schema import REDACTED, Bool, ConfigError, Failed, SchemaCheck, Section, camel, known, opt, problems_of, to_raw

HTTPS_URL_RE = re.compile(r"^https://[A-Za-z0-9.-]+(:\d{1,5})?(/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*)?$", re.ASCII)
HOST_RE = re.compile(r"^(?=.{1,253}$)([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$", re.ASCII)
# ACM certificate ARNs (AWS General Reference, "Amazon Resource Names": arn:aws:acm:<region>:<account>:certificate/<id>)
ACM_ARN_RE = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$", re.ASCII)
EMAIL_RE = re.compile(r"^[^@\s]{1,64}@[A-Za-z0-9.-]{1,255}$", re.ASCII)
# an IdP group as its groups claim names it: printable, no spaces at the ends, never Kubernetes' system: prefix
GROUP_RE = re.compile(r"^(?!system:)[\x21-\x7e]([\x20-\x7e]{0,254}[\x21-\x7e])?$", re.ASCII)
WORLD = ("0.0.0.0/0", "::/0")
SET_SECRET = "pulumi config set --secret --path 'training-platform:portal.clientSecret' <secret>"
REQUIRED = ("host", "certificateArn", "issuer", "authorizationEndpoint", "tokenEndpoint", "userInfoEndpoint", "clientId", "clientSecret")


def _check_inbound_cidrs(values: list[str]) -> str | None:
    if not values:
        # the ALB's inbound-cidrs annotation would be empty (k8s/builders/portal.py ingresses)
        return "required: at least one CIDR block (an empty list leaves the ALB's inbound-cidrs empty); for everyone say so: [0.0.0.0/0]"
    return _cidr_list(values)


_inbound_cidrs = SchemaCheck(_check_inbound_cidrs, {**getattr(_cidr_list, "schema", {}), "minItems": 1})


class PortalTeamSettings(Section):
    """Who belongs to one team when they sign in to the portal."""

    groups: list[str] = opt([], "IdP groups (the login's groups claim, which the ALB takes only from the IdP's userinfo endpoint: some IdPs, Entra ID and Cognito among them, send none there) whose members act as this team; groups decide before emails",
                            check=_pattern(GROUP_RE, "a group name of printable characters, not starting with system:"))
    emails: list[str] = opt([], "e-mail addresses (the login's email claim, used only when email_verified is true) that act as this team", check=_pattern(EMAIL_RE, "an e-mail address such as ana@example.com"))

    def problems(self, path: str) -> Iterator[ConfigError]:
        # duplicates first: they are judged also in a list with a bad item, which stops the rule after
        yield from duplicate_errors(f"{path}.groups", self.groups)
        yield from duplicate_errors(f"{path}.emails", self.emails, "allowed: a list without duplicates (addresses compare without case)", same=str.lower)
        if not self.groups and not self.emails:
            yield ConfigError(path, {}, "required: at least one of groups or emails (who signs in as this team)")


class PortalSettings(Section):
    """The portal: its address, the ALB's OIDC login, and which logins act as which team."""

    enabled: Bool = opt(False, "run the teams' portal (web page and API) behind an ALB with OIDC login; every Kubernetes call is made as the signed-in user's team")
    host: str | None = opt(None, "host name users open (DNS points it at the ALB; the certificate's name)", check=_pattern(HOST_RE, "a DNS name such as portal.example.com"))
    certificate_arn: str | None = opt(None, "ACM certificate for host (HTTPS listener)", check=_pattern(ACM_ARN_RE, "an ACM certificate ARN such as arn:aws:acm:us-west-2:123456789012:certificate/<uuid>"))
    issuer: str | None = opt(None, "OIDC issuer of the identity provider", check=_pattern(HTTPS_URL_RE, "an https:// URL"))
    authorization_endpoint: str | None = opt(None, "OIDC authorization endpoint", check=_pattern(HTTPS_URL_RE, "an https:// URL"))
    token_endpoint: str | None = opt(None, "OIDC token endpoint", check=_pattern(HTTPS_URL_RE, "an https:// URL"))
    user_info_endpoint: str | None = opt(None, "OIDC user info endpoint: the ALB puts only this endpoint's claims (groups, email, email_verified) in x-amzn-oidc-data, not the ID token's", check=_pattern(HTTPS_URL_RE, "an https:// URL"))
    client_id: str | None = opt(None, "OIDC client id of the portal's app at the identity provider")
    client_secret: str | None = opt(None, "OIDC client secret: set it as a Pulumi secret (pulumi config set --secret --path 'training-platform:portal.clientSecret')")
    scope: str = opt("openid email", "OIDC scopes the ALB asks for (add the one your IdP needs for a groups claim)", check=_pattern(re.compile(r"^openid( [A-Za-z0-9_:.-]+)*$", re.ASCII), "space-separated scopes starting with openid"))
    inbound_cidrs: list[str] = opt(["0.0.0.0/0"], "who may reach the ALB (its security group); unset, everyone (0.0.0.0/0: every page needs the OIDC login), which the render and preview say each run until it is set", check=_inbound_cidrs)
    api_bearer_tokens: Bool = opt(False, "pass a Kubernetes bearer token sent to /api/* on to the API server (a team's backend without a browser login); "
                                  "this opens the private API server to anyone on inboundCidrs who holds a token, a service account's included: leave it off unless teams need it")
    teams: dict[str, PortalTeamSettings] = opt({}, "team (one of tenants) -> who signs in as it: groups (IdP groups, the login's groups claim) and/or emails (the login's email claim)")

    def problems(self, path: str) -> Iterator[ConfigError]:
        yield from known(self._team_problems(path))
        if not self.enabled:
            for name in sorted(self.model_fields_set - {"enabled"}, key=lambda n: camel(n)):
                value = getattr(self, name)
                if isinstance(value, Failed) or value == type(self).model_fields[name].get_default(call_default_factory=True):
                    continue  # reported already, or set to what it is anyway
                key = camel(name)
                yield ConfigError(f"{path}.{key}", "<set>" if key == "clientSecret" else to_raw(value), "does nothing while portal.enabled is false; set portal.enabled: true or remove it")
            return
        yield from duplicate_errors(f"{path}.inboundCidrs", self.inbound_cidrs, "allowed: a list without duplicates (the ALB's inbound-cidrs lists each block once)")
        if self.inbound_cidrs == []:  # a list's items are judged one by one (config/schema.py): an empty one here
            yield ConfigError(f"{path}.inboundCidrs", [], _check_inbound_cidrs([]) or "")
        for key in REQUIRED:
            if getattr(self, _attr(key)) is None:
                yield ConfigError(f"{path}.{key}", None, "required when portal.enabled is true")
        if not self.teams:
            yield ConfigError(f"{path}.teams", {}, "required when portal.enabled is true: at least one team (one of tenants) and who signs in as it")


    def _team_problems(self, path: str) -> Iterator[ConfigError]:
        for team, login in self.teams.items():  # a map of sections: not reached by problems_of
            yield from problems_of(login, f"{path}.teams.{team}")


def _attr(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), key)


def portal_rules(tenants: list[str], portal: PortalSettings, *, region: str = "", partition: str = "aws") -> Iterator[ConfigError]:
    """Across sections: the portal's teams are the stack's tenants; a Region of the ``aws`` partition."""
    if not portal.enabled:
        return
    if partition != "aws":
        # trainctl/portal/identity.py KEY_URL is the ALB key endpoint of the aws partition (ELB User
        # Guide, "Authenticate users using an Application Load Balancer"); GovCloud and China publish
        # their keys elsewhere, which the portal does not know
        yield ConfigError("portal.enabled", True, f"the portal verifies the ALB's signature with the key endpoint of the aws partition, and {region} is in {partition}; allowed: false in this Region")
    if not tenants:
        yield ConfigError("portal.enabled", True, "the portal serves teams and this stack has none; configure tenants")
    for team in portal.teams:
        if team not in tenants:
            yield ConfigError(f"portal.teams.{team}", team, f"not a team of this stack; allowed: one of tenants ({', '.join(tenants) or 'none'})")


def portal_advice(portal: PortalSettings) -> list[str]:
    """What is kept but said (a render and preview warning): an enabled portal open to every
    address because inboundCidrs is unset. Kept, not refused: the ALB asks for the OIDC login on
    every page before a request reaches the portal, a login page is usually open to the world, and
    stack files that rely on the default keep working; said, so that it is never silent. Setting
    inboundCidrs (to 0.0.0.0/0 too) silences it."""
    if not portal.enabled or "inbound_cidrs" in portal.model_fields_set:
        return []
    tokens = " and, with apiBearerTokens, the API server to anyone holding a Kubernetes token" if portal.api_bearer_tokens else ""
    return [f"portal.inboundCidrs is unset: the portal's ALB takes requests from every address ({', '.join(portal.inbound_cidrs)}): its login page{tokens}; "
            "set portal.inboundCidrs to your networks, or to [0.0.0.0/0] to say it is meant"]


def plain_secret_problems(raw_portal: object, secret: bool) -> list[ConfigError]:
    """portal.clientSecret given in plain text: in the stack file (and the state) for anyone who
    reads it. ``secret``: whether Pulumi holds training-platform:portal as a secret (a secure value in it)."""
    if secret or not isinstance(raw_portal, dict) or raw_portal.get("clientSecret") in (None, ""):
        return []
    return [ConfigError("portal.clientSecret", REDACTED, f"in plain text in the stack file; set it as a secret: {SET_SECRET}")]
