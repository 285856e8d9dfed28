"""The API's documentation page (``/api/docs``): swagger-ui from the portal itself, never a CDN (an
offline or locked-down network loads it too). Its dist files come from the pinned fastapi-swagger
package (requirements.txt; the swagger-ui release it ships: versions.py PORTAL_SWAGGER_UI_VERSION),
served under ``/static/swagger-ui/``. The page starts swagger-ui from an external file
(static/swagger-init.js), so the pages' Content-Security-Policy ``default-src 'self'`` holds: no
inline script, no evaluated code; ``data:`` images only (swagger-ui's icons in its CSS).
FastAPI's ``get_swagger_ui_html`` is not used: it starts swagger-ui with an inline script; nor the
package's ``patch_fastapi``, which serves that page."""

from __future__ import annotations

import pathlib

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse

router = APIRouter(include_in_schema=False)
ASSETS = {"swagger-ui.css": "text/css; charset=utf-8", "swagger-ui-bundle.js": "text/javascript; charset=utf-8", "favicon-32x32.png": "image/png"}
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


def dist() -> pathlib.Path:
    """swagger-ui's dist directory of the installed package."""
    from importlib import resources

    return pathlib.Path(str(resources.files("fastapi_swagger") / "resources"))


@router.get("/api/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    from trainctl.portal.pages import templates

    html = templates.get_template("apidocs.html").render(title=request.app.title, openapi_url=request.app.openapi_url)
    return HTMLResponse(html, headers={"Content-Security-Policy": CSP, "X-Frame-Options": "DENY"})


@router.get("/static/swagger-ui/{name}")
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise HTTPException(status_code=404)
    return FileResponse(dist() / name, media_type=ASSETS[name], headers={"Cache-Control": "public, max-age=86400"})
