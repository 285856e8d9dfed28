"""The portal's front door, an ASGI middleware that runs before any route reads a request's body:

* a body larger than :data:`MAX_REQUEST_BYTES` is refused with 413: by its ``Content-Length``
  before a byte of it is read, and a body without one (chunked) as soon as it grows past the cap;
* every route but the health check, the static files and the API's documentation needs the
  caller's identity (app.py ``Auth.caller``): without one the answer is 401 and the body is never
  read, so nobody unauthenticated can fill the pod's memory or its ``/tmp`` (a 64 MiB emptyDir).

The identity is checked in a worker thread (a first request with a new key id fetches the ALB's
public key, a blocking call) and kept in the request's scope, where the routes find it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from trainctl.portal.api import MAX_CODE_CHARS
from trainctl.portal.identity import Unauthorized
from trainctl.portal.upload import MAX_UPLOAD_BYTES

# the largest request a route takes: an upload (MAX_UPLOAD_BYTES and its multipart framing), or a
# JSON create whose training_code (MAX_CODE_CHARS) is escaped (at most 6 bytes a character, \\uXXXX)
MAX_REQUEST_BYTES = max(MAX_UPLOAD_BYTES, 6 * MAX_CODE_CHARS) + 64 * 1024
CALLER_KEY = "portal.caller"
OPEN_PATHS = ("/healthz",)
OPEN_PREFIXES = ("/static/", "/api/docs", "/api/openapi.json")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(HTTPException):
    """A body without Content-Length grew past the cap (raised while a route reads it)."""

    def __init__(self) -> None:
        super().__init__(413, too_large())


def too_large() -> str:
    return f"the request is larger than {MAX_REQUEST_BYTES} bytes"


def problem(field: str, text: str, status: int) -> JSONResponse:
    return JSONResponse({"problems": [{"field": field, "problem": text}]}, status_code=status)


class Guard:
    def __init__(self, app: ASGIApp, *, auth: Any, max_bytes: int = MAX_REQUEST_BYTES):
        self.app, self.auth, self.max_bytes = app, auth, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is None:
            await problem("request", "Content-Length is not a number", 400)(scope, receive, send)
            return
        if length > self.max_bytes:
            await problem("request", too_large(), 413)(scope, receive, send)
            return
        path = scope.get("path", "")
        if path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            try:
                scope[CALLER_KEY] = await run_in_threadpool(self.auth.caller, Request(scope))
            except Unauthorized as err:
                await problem("identity", str(err), 401)(scope, receive, send)
                return
        await self.app(scope, self._capped(receive), send)

    def _capped(self, receive: Receive) -> Receive:
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge()
            return message

        return capped


def _content_length(scope: Scope) -> int | None:
    """The declared length (0 when none is declared), or None when it is not a number."""
    for key, value in scope.get("headers") or ():
        if key == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() and len(text) <= 18 else None
    return 0
