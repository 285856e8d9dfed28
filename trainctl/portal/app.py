"""The portal's FastAPI application: :func:`create_app` builds it for one way of running
(``alb``: in the cluster behind the ALB; ``local``: ``trainctl ui`` on 127.0.0.1). The routes are in
api.py (JSON, ``/api/*``, OpenAPI at ``/api/docs``) and pages.py (HTML forms)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kubernetes import client

from trainctl.kube import ClusterError, NotAllowed
from trainctl.portal.backend import Backend
from trainctl.portal.guard import CALLER_KEY, BodyTooLarge, Guard
from trainctl.portal.identity import FORWARDED_FOR, FORWARDED_PROTO, OIDC_HEADER, AlbIdentity, Caller, KeyFetcher, TeamLogin, Unauthorized, bearer, forwarded_source
from trainctl.portal.service import Portal
from trainctl.portal.submission import Problems


@dataclass(frozen=True)
class Settings:
    """How this portal runs. ``signer``: the ALB's ARN, or the ARN up to and with ``app/<name>/``
    (the ALB's name is fixed by the Ingress; its id suffix is AWS's)."""

    mode: str  # alb | local
    region: str = ""
    signer: str = ""
    teams: dict[str, TeamLogin] = field(default_factory=dict)
    local_caller: Caller | None = None
    allowed_hosts: tuple[str, ...] = ()  # local: the Host headers accepted (DNS rebinding)
    bearer_tokens: bool = False  # alb: pass a Kubernetes bearer token on /api/* to the API server (portal.apiBearerTokens)
    heartbeat_s: float = 15.0
    poll_s: float = 5.0  # how often a state stream reads the job (or the list) again (each read: a few API calls)


_UNION_TAGS = {"int": "a whole number", "str": "a string", "float": "a number", "bool": "true or false", "none": "null", "list": "a list", "dict": "an object"}


def validation_problems(errors: Any) -> list[dict[str, str]]:
    """FastAPI's validation errors as one problem per field: the body's ``loc`` without its ``body``
    head and without the member tag pydantic adds for each member of a union (a value that is none
    of ``int | str`` is one problem of ``config.memory_per_node``: "allowed: a whole number or a
    string"), not one per member."""
    fields: dict[str, list[str]] = {}
    messages: dict[str, str] = {}
    for e in errors:
        loc = [str(p) for p in e.get("loc", ())[1:]]
        tag = loc.pop() if len(loc) > 1 and loc[-1] in _UNION_TAGS else None
        field = ".".join(loc) or "request"
        messages.setdefault(field, str(e.get("msg", "invalid")))
        fields.setdefault(field, [])
        if tag is not None:
            fields[field].append(_UNION_TAGS[tag])
    return [{"field": f, "problem": f"allowed: {' or '.join(kinds)}" if len(kinds) > 1 else messages[f]} for f, kinds in fields.items()]


def _status_of(err: ClusterError) -> int:
    text = str(err)
    for code, status in (("(HTTP 403)", 403), ("(HTTP 404)", 404), ("(HTTP 409)", 409), ("(HTTP 422)", 422), ("(HTTP 401)", 401), ("(HTTP 400)", 400)):
        if code in text:
            return status
    if " not found in namespace " in text:
        return 404
    if text.startswith(("you may not ", "not allowed: ")):  # not allowed: a refused read (trainctl/kube.py NotAllowed)
        return 403
    return 502


class Auth:
    def __init__(self, settings: Settings, alb_keys: Callable[[str], Any] | KeyFetcher | None):
        self.settings = settings
        self.alb = AlbIdentity(region=settings.region, alb_arn=settings.signer, teams=settings.teams, keys=alb_keys) if settings.mode == "alb" else None
        self.csrf_key = secrets.token_bytes(32)

    def caller(self, request: Request) -> Caller:
        known = request.scope.get(CALLER_KEY)  # checked by the guard before the body was read (guard.py)
        if isinstance(known, Caller):
            return known
        if self.settings.mode == "local":
            host = request.headers.get("host", "")
            if self.settings.allowed_hosts and host not in self.settings.allowed_hosts:
                raise Unauthorized(f"Host {host[:100]!r} is not this portal's address")
            assert self.settings.local_caller is not None
            return self.settings.local_caller
        token = bearer(request.headers.get("authorization"))
        oidc = request.headers.get(OIDC_HEADER)
        if token is not None and request.url.path.startswith("/api/"):
            if self.settings.bearer_tokens:
                return Caller(name="bearer token", namespace=None, token=token, via="bearer")
            if not oidc:
                raise Unauthorized("this portal takes no Kubernetes bearer tokens (portal.apiBearerTokens is off): sign in through the portal's address, or use kubectl or trainctl")
        assert self.alb is not None
        if not oidc:
            return self.alb.caller(oidc)  # the 401 that says how to sign in
        # the path the deployment expects (the ALB), and the client whose key-fetch budget a new kid spends
        source = forwarded_source(request.headers.getlist(FORWARDED_FOR), request.headers.get(FORWARDED_PROTO))
        return self.alb.caller(oidc, team=request.query_params.get("team"), source=source)

    def csrf_token(self, caller: Caller) -> str:
        return hmac.new(self.csrf_key, f"{caller.via}|{caller.name}|{caller.team}".encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, caller: Caller, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(caller), str(token))


def create_app(base: client.Configuration | None, settings: Settings, *, alb_keys: Callable[[str], Any] | KeyFetcher | None = None, backend: Backend | None = None) -> FastAPI:
    """The portal. ``base``: the API server's address and the portal's own credentials (in-cluster:
    its service account, which may only impersonate; local: the kubeconfig's). ``alb_keys``: kid ->
    public key, or a :class:`KeyFetcher` around a test's fetch function, for tests only (production
    fetches the Region's ALB keys). ``backend``: another
    answer to the routes' calls than the cluster's (trainctl/portal/backend.py; ``trainctl ui
    --local``: the jobs of this machine, and no ``base``)."""
    from trainctl.portal import api, apidocs, pages
    from trainctl.portal.local_service import LocalNotFound

    if backend is None and base is None:
        raise ValueError("create_app: the cluster's portal needs the API server's configuration (base)")
    app = FastAPI(title="training-platform portal", docs_url=None, openapi_url="/api/openapi.json", redoc_url=None)  # /api/docs: apidocs.py, no CDN
    app.state.portal = backend if backend is not None else Portal(base, base_headers=(settings.local_caller.headers if settings.local_caller else None))  # type: ignore[arg-type]
    app.state.auth = Auth(settings, alb_keys)
    app.state.settings = settings

    @app.exception_handler(Unauthorized)
    async def _unauthorized(request: Request, err: Unauthorized):  # noqa: ARG001
        return JSONResponse({"problems": [{"field": "identity", "problem": str(err)}]}, status_code=401)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, err: BodyTooLarge):  # noqa: ARG001  (a chunked body past the cap, guard.py)
        return JSONResponse({"problems": [{"field": "request", "problem": str(err.detail)}]}, status_code=413)

    @app.exception_handler(Problems)
    async def _problems(request: Request, err: Problems):  # noqa: ARG001
        return JSONResponse({"problems": err.problems}, status_code=err.status)

    @app.exception_handler(LocalNotFound)
    async def _not_found(request: Request, err: LocalNotFound):  # noqa: ARG001
        return JSONResponse({"problems": [{"field": "name", "problem": str(err)}]}, status_code=404)

    @app.exception_handler(ClusterError)
    async def _cluster(request: Request, err: ClusterError):  # noqa: ARG001
        problem: dict[str, str] = {"field": "cluster", "problem": str(err)}
        if isinstance(err, NotAllowed) and err.user:
            problem["refused_as"] = err.user  # the API server judged the caller as this (impersonated) user
        return JSONResponse({"problems": [problem]}, status_code=_status_of(err))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):  # noqa: ARG001
        return JSONResponse({"problems": validation_problems(err.errors())}, status_code=422)

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception):  # noqa: ARG001  (never a traceback to the caller)
        import logging

        logging.getLogger("portal").exception("unhandled error")
        return JSONResponse({"problems": [{"field": "server", "problem": f"internal error ({type(err).__name__})"}]}, status_code=500)

    from fastapi.staticfiles import StaticFiles

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:  # the probes' and the ALB's health check: no identity, no cluster call
        return {"status": "ok"}

    app.include_router(api.router)
    app.include_router(pages.router)
    app.include_router(apidocs.router)  # before the /static mount: its swagger-ui files are under /static/swagger-ui/
    app.mount("/static", StaticFiles(directory=pages.HERE / "static"), name="static")
    app.add_middleware(Guard, auth=app.state.auth)  # identity and size before any body is read
    return app
