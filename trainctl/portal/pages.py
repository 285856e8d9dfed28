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
from trainctl.portal.identity import Caller, Unauthorized
from trainctl.portal.service import JobSpec, Problems
from trainctl.portal.upload import MAX_UPLOAD_BYTES, Part

HERE = pathlib.Path(__file__).parent
router = APIRouter(include_in_schema=False)
templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"], default=True))
# the mockup's size presets: GPUs, CPUs and GB of memory per worker
PRESETS: dict[str, dict[str, Any]] = {
    "small": {"title": "Small", "gpus": 1, "cpus": 4, "memory": 16},
    "medium": {"title": "Medium", "gpus": 2, "cpus": 8, "memory": 32},
    "large": {"title": "Large", "gpus": 4, "cpus": 16, "memory": 64},
    "custom": {"title": "Custom"},
}
EXAMPLE = "import os\nprint('hello from worker', os.environ.get('PET_NODE_RANK', os.environ.get('TF_CONFIG', '?')))\n"


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


def _clone(request: Request, caller: Caller, ns: str, name: str) -> dict[str, Any]:
    """The form as the job was submitted: framework, nodes, GPUs, image, command, its train.py."""
    from trainctl.portal.service import gpus_of

    found = request.app.state.portal.submitted_form(caller, ns, name)
    tj = found["trainjob"]
    trainer = tj["spec"].get("trainer") or {}
    nodes = int(trainer.get("numNodes") or 1)
    per = (gpus_of(tj) or nodes) // nodes
    form = {"framework": "tensorflow" if "tensorflow" in tj["spec"]["runtimeRef"]["name"] else "pytorch", "num_nodes": nodes, "preset": "custom", "gpu_per_node": per,
            "cpu_per_node": "", "memory_per_node": "", "image": trainer.get("image") or "", "name": "", "command": "python train.py", "training_code": found["train_py"]}
    return form


@router.get("/submit", response_class=HTMLResponse)
def submit_page(request: Request):
    caller, ns = _who(request)
    clone = request.query_params.get("clone")
    form = _clone(request, caller, ns, clone) if clone else {
        "framework": "pytorch", "num_nodes": 1, "preset": "small", "gpu_per_node": "", "cpu_per_node": "", "memory_per_node": "", "image": "", "name": "", "command": "python train.py", "training_code": EXAMPLE,
    }
    return _page(request, "submit.html", caller, ns, form=form, presets=PRESETS, problems=[], clone=clone)


@router.post("/submit", response_class=HTMLResponse)
async def submit(request: Request):
    caller, ns = _who(request)
    data = await request.form(max_files=1000, max_fields=100)
    if not request.app.state.auth.csrf_ok(caller, data.get("csrf")):
        raise Unauthorized("the form's CSRF token is missing or wrong: reload the page")
    form = {k: (v if isinstance(v, str) else "") for k, v in data.items() if k != "files"}
    preset = PRESETS.get(form.get("preset", ""), PRESETS["custom"])
    gpus, cpus, memory = (preset["gpus"], preset["cpus"], preset["memory"]) if "gpus" in preset else (form.get("gpu_per_node"), form.get("cpu_per_node") or None, form.get("memory_per_node") or None)
    parts, total = [], 0
    for f in data.getlist("files"):
        if isinstance(f, UploadFile) and f.filename:
            content = await f.read(MAX_UPLOAD_BYTES + 1 - total)
            total += len(content)
            parts.append(Part(f.filename, content))
    problems: list[dict[str, str]] = []
    if total > MAX_UPLOAD_BYTES:
        problems.append({"field": "files", "problem": f"the upload is larger than {MAX_UPLOAD_BYTES} bytes"})
    if not parts:
        parts = [Part("train.py", form.get("training_code", "").encode())]
    image = form.get("image") if form.get("image_choice") == "custom" else None
    spec = JobSpec(namespace=ns, framework=form.get("framework", ""), num_nodes=form.get("num_nodes"), gpu_per_node=gpus, cpu_per_node=cpus, memory_per_node=memory,
                   command=form.get("command") or "python train.py", name=form.get("name") or None, image=image or None)
    try:
        if problems:
            raise Problems(problems)
        done = await run_in_threadpool(request.app.state.portal.create, caller, spec, parts)
    except Problems as err:
        return _page(request, "submit.html", caller, ns, status=422, form=form, presets=PRESETS, problems=err.problems, clone=None)
    except ClusterError as err:
        return _page(request, "submit.html", caller, ns, status=403 if "(HTTP 403)" in str(err) else 502, form=form, presets=PRESETS, problems=[{"field": "cluster", "problem": str(err)}], clone=None)
    return RedirectResponse(f"/jobs/{done['trainjob']}?submitted=1", status_code=303)


@router.get("/team", response_class=HTMLResponse)
def team_page(request: Request):
    caller, ns = _who(request)
    return _page(request, "team.html", caller, ns, team=request.app.state.portal.team(caller, ns))
