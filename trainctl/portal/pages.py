"""The portal's web pages (server-rendered, Jinja2 with autoescape on: every name, message and log
line from a job is escaped; the live log is added as text by static/portal.js). Forms carry a CSRF
token bound to the caller (app.py ``Auth.csrf_token``); a form post without it is refused."""

from __future__ import annotations

import pathlib
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from trainctl import progress
from trainctl.kube import ClusterError
from trainctl.portal import chart
from trainctl.portal import form as form_logic
from trainctl.portal.identity import Caller, Unauthorized
from trainctl.portal.submission import Problems
from trainctl.portal.upload import MAX_UPLOAD_BYTES, Part

HERE = pathlib.Path(__file__).parent
router = APIRouter(include_in_schema=False)
templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"], default=True))


def _age(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"


def _page(request: Request, name: str, caller: Caller, namespace: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = templates.get_template(name).render(caller=caller, namespace=namespace, csrf=request.app.state.auth.csrf_token(caller), notice=context.pop("notice", None),
                                               mode_note=request.app.state.portal.mode_note, **context)
    return HTMLResponse(html, status_code=status, headers={"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'", "X-Frame-Options": "DENY"})


def _who(request: Request) -> tuple[Caller, str]:
    caller = request.app.state.auth.caller(request)
    ns = caller.namespace if caller.via == "alb" else (request.query_params.get("namespace") or caller.namespace)
    if not ns:
        raise Unauthorized("no namespace: the kubeconfig context names none; pass --namespace to trainctl ui")
    return caller, ns


@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request):
    caller, ns = _who(request)
    error, jobs = None, []
    try:
        jobs = request.app.state.portal.list(caller, ns)
    except ClusterError as err:
        error = str(err)
    for j in jobs:
        j["age"] = _age(j.get("age_s"))
    notice = f"Job {request.query_params['cancelled']} cancelled." if request.query_params.get("cancelled") else None
    return _page(request, "jobs.html", caller, ns, jobs=jobs, error=error, notice=notice)


@router.get("/jobs/{name}", response_class=HTMLResponse)
def job_page(request: Request, name: str):
    caller, ns = _who(request)
    portal = request.app.state.portal
    job = portal.status(caller, ns, name)
    try:
        points = portal.progress_series(caller, ns, name)["points"]
    except ClusterError:  # the log may not be readable (yet): the chart says it has no events
        points = []
    return _page(request, "job.html", caller, ns, job=job, events=portal.events(caller, ns, name), findings=portal.diagnosis(caller, ns, name),
                 series={"points": points, "summary": chart.summary(points)}, notice="Job submitted." if request.query_params.get("submitted") else None)


@router.get("/help/progress-events", response_class=HTMLResponse)
def progress_help(request: Request):
    """How a program reports its progress (docs/progress-events.md, in short), with the example the doc gives."""
    caller, ns = _who(request)
    return _page(request, "progress_help.html", caller, ns, example=progress.EXAMPLE, fields=progress.DOCUMENTED_FIELDS)


@router.post("/jobs/{name}/cancel")
async def cancel(request: Request, name: str):
    caller, ns = _who(request)
    form = await request.form()
    if not request.app.state.auth.csrf_ok(caller, form.get("csrf")):
        raise Unauthorized("the form's CSRF token is missing or wrong: reload the page")
    await run_in_threadpool(request.app.state.portal.delete, caller, ns, name)
    return RedirectResponse(f"/?cancelled={name}", status_code=303)


def _form_page(request: Request, caller: Caller, ns: str, form: dict[str, Any], *, problems: list[dict[str, str]] | None = None, clone: str | None = None, status: int = 200,
               new: bool = False) -> HTMLResponse:
    local = bool(request.app.state.portal.local)
    facts = request.app.state.portal.platform_facts(caller, ns)  # the choices the cluster runs (its pools, its priorities)
    presets = form_logic.preset_choices(facts, local=local)
    form = form_logic.with_offered(form, presets) if new else form
    return _page(request, "submit.html", caller, ns, status=status, form=form, presets=presets, frameworks=form_logic.framework_choices(), clone=clone,
                 problems=form_logic.problem_view(list(problems or [])), carried=form_logic.carried_list(form.get("carried", "")), local=local,
                 priorities=form_logic.priority_choices(facts, local=local), default_priority=(facts or {}).get("defaultPriority"))


@router.get("/submit", response_class=HTMLResponse)
def submit_page(request: Request):
    caller, ns = _who(request)
    clone = request.query_params.get("clone")
    form = form_logic.clone_form(request.app.state.portal.submitted_form(caller, ns, clone)) if clone else form_logic.blank()
    return _form_page(request, caller, ns, form, clone=clone, new=not clone)


@router.post("/submit", response_class=HTMLResponse)
async def submit(request: Request):
    caller, ns = _who(request)
    data = await request.form(max_files=1000, max_fields=100, max_part_size=MAX_UPLOAD_BYTES)  # the carried files' field holds up to a ConfigMap's code, as JSON
    if not request.app.state.auth.csrf_ok(caller, data.get("csrf")):
        raise Unauthorized("the form's CSRF token is missing or wrong: reload the page")
    form: dict[str, Any] = {k: (v if isinstance(v, str) else "") for k, v in data.items() if k != "files"}
    form["notes"] = [n for n in data.getlist("note") if isinstance(n, str)]  # a clone's notes, kept through a refused post
    uploads, total = [], 0
    for f in data.getlist("files"):
        if isinstance(f, UploadFile) and f.filename:
            content = await f.read(MAX_UPLOAD_BYTES + 1 - total)
            total += len(content)
            uploads.append(Part(f.filename, content))
    spec, parts, problems = form_logic.submission(form, uploads, ns, local=bool(request.app.state.portal.local))
    if total > MAX_UPLOAD_BYTES:
        problems.append({"field": "files", "problem": f"the upload is larger than {MAX_UPLOAD_BYTES} bytes"})
    clone = form.get("clone_of") or None
    try:
        if problems:
            raise Problems(problems)
        done = await run_in_threadpool(request.app.state.portal.create, caller, spec, parts)
    except Problems as err:
        return _form_page(request, caller, ns, form, problems=err.problems, clone=clone, status=422)
    except ClusterError as err:
        return _form_page(request, caller, ns, form, problems=[{"field": "cluster", "problem": str(err)}], clone=clone, status=403 if "(HTTP 403)" in str(err) else 502)
    return RedirectResponse(f"/jobs/{done['trainjob']}?submitted=1", status_code=303)


@router.get("/team", response_class=HTMLResponse)
def team_page(request: Request):
    caller, ns = _who(request)
    return _page(request, "team.html", caller, ns, team=request.app.state.portal.team(caller, ns))
