"""The portal's JSON API (``/api/*``): the seed guide's four endpoints with its request and
response shapes, and upload, list, events, diagnosis, queue position, team usage, a log stream, the
jobs' state as streams (trainctl/portal/live.py) and their progress events as a series and a chart.
Bad input: HTTP 422 with ``{"problems": [{"field", "problem"}, ...]}``, one entry per problem,
nothing created; what the API server refuses keeps its status (403, 404, 409)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from config.secrets import shown
from trainctl.portal import chart
from trainctl.portal.identity import Caller, Unauthorized
from trainctl.portal.submission import JobSpec, Problems, guide_name, request_of
from trainctl.portal.upload import MAX_UPLOAD_BYTES, Part

router = APIRouter(prefix="/api", tags=["trainjobs"])
MAX_CODE_CHARS = 1024 * 1024
LOG_TAIL_MAX = 10000
CSRF_HEADER = "x-csrf-token"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class JobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_nodes: StrictInt = Field(description="workers (nodes)")
    gpu_per_node: StrictInt = Field(description="GPUs per worker")
    cpu_per_node: StrictInt | StrictStr | None = Field(None, description="CPUs per worker, at least (the instance type is chosen to give them): a number or a Kubernetes quantity (\"4\", \"500m\")")
    memory_per_node: StrictInt | StrictStr | None = Field(None, description="memory per worker, at least: a Kubernetes quantity (\"16Gi\", as the seed guide sends it) or a whole number of GiB")


class CreateRequest(BaseModel):
    """The seed guide's request (``user_id``, ``namespace``, ``framework``, ``training_code``,
    ``config``), plus an optional name, image, command and trainctl submit's options (variables,
    Secret references, TTL, priority, grace period, requirements install time limit)."""

    model_config = ConfigDict(extra="forbid")
    user_id: str | None = Field(None, description="the caller (must be the signed-in user when given)")
    namespace: str
    framework: str = Field(description="pytorch or tensorflow")
    training_code: str = Field(description="the training program (train.py)")
    config: JobConfig
    name: str | None = None
    image: str | None = None
    command: str | None = Field(None, description="default: python train.py")
    env: dict[str, str] | None = Field(None, description="variables of the training container, NAME: value (not the platform's own, no credentials: docs/env-and-secrets.md)")
    secret_env: dict[str, str] | None = Field(None, description="variables from a Secret of the namespace, NAME: SECRET/KEY (a secretKeyRef)")
    ttl_seconds_after_finished: StrictInt | None = Field(None, description="delete the job this many seconds after it finishes (default: the platform's trainjobs.finishedJobRetention; at most its finishedJobRetentionMax); checkpoints stay")
    priority: StrictStr | None = Field(None, description="Kueue priority: low, normal or high (default: the team's); low jobs are preempted first")
    grace_seconds: StrictInt | None = Field(None, description="seconds from SIGTERM to SIGKILL, one the platform offers (each a runtime variant; default: the runtime's)")
    deps_timeout: StrictInt | None = Field(None, description="seconds each node may take to install the code's requirements.txt (default 600)")


class CreateResponse(BaseModel):
    status: Literal["success"] = Field(description="the seed guide's answer to a created job")
    trainjob_name: str
    namespace: str
    created_at: str | None
    instance_type: str


def caller_of(request: Request) -> Caller:
    return request.app.state.auth.caller(request)


def _namespace(caller: Caller, namespace: str | None) -> str:
    ns = namespace or caller.namespace
    if not ns:
        raise Problems([{"field": "namespace", "problem": "required"}])
    return ns


def _mutation_allowed(request: Request, caller: Caller, *, json_body: bool) -> None:
    """A browser's session (the ALB's cookie, or a laptop) must not be usable from another site: a
    JSON body (a cross-site form cannot send application/json without a CORS preflight) or the
    CSRF token in a header."""
    if caller.via == "bearer":
        return
    if json_body and request.headers.get("content-type", "").split(";")[0].strip() == "application/json":
        return
    if request.app.state.auth.csrf_ok(caller, request.headers.get(CSRF_HEADER)):
        return
    raise Unauthorized(f"a change from a browser needs a JSON body or the {CSRF_HEADER} header (cross-site request protection)")


def _not_cross_site(request: Request) -> None:
    """DELETE takes no CSRF token (the seed guide's clients send no header): no form or simple
    cross-site request can send it, and a script of another origin needs CORS' preflight, which
    this API never grants. A browser also says where a request comes from (Fetch Metadata,
    ``Sec-Fetch-Site``): one from another site is refused all the same."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Unauthorized("a change from another site's page is refused (cross-site request protection)")


def _namespace_problems(caller: Caller, ns: str) -> list[dict[str, str]]:
    if caller.via == "alb" and ns != caller.namespace:
        return [{"field": "namespace", "problem": f"{shown(ns[:63])} is not your team's namespace ({caller.namespace})"}]
    return []


def input_problems(spec: JobSpec, *, local: bool = False) -> list[dict[str, str]]:
    """Every problem of the submission itself (before any cluster read); ``local``: the portal of
    ``trainctl ui --local``, which judges as ``trainctl submit --local``."""
    try:
        request_of(spec, None, local=local)
    except Problems as err:
        return err.problems
    return []


def _created(done: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "trainjob_name": done["trainjob"], "namespace": done["namespace"], "created_at": done.get("created"), "instance_type": done["instanceType"]}


@router.post("/trainjob/create", response_model=CreateResponse, summary="create a TrainJob from code (the seed guide's request)")
def create(request: Request, body: CreateRequest) -> dict[str, Any]:
    caller = caller_of(request)
    _mutation_allowed(request, caller, json_body=True)
    problems = []
    if body.user_id is not None and caller.via == "alb" and body.user_id != caller.name:
        problems.append({"field": "user_id", "problem": "not the signed-in user (leave it out: the portal knows who you are)"})
    if not body.training_code.strip():
        problems.append({"field": "training_code", "problem": "required: the training program (train.py)"})
    elif len(body.training_code) > MAX_CODE_CHARS:
        problems.append({"field": "training_code", "problem": f"{len(body.training_code)} characters: allowed: at most {MAX_CODE_CHARS} (a ConfigMap holds 1 MiB)"})
    problems += _namespace_problems(caller, body.namespace)
    name = body.name or (guide_name(body.user_id, body.config.num_nodes, datetime.now(UTC)) if body.user_id else None)  # the guide's <user_id>-job-<timestamp>
    spec = JobSpec(namespace=body.namespace, framework=body.framework, num_nodes=body.config.num_nodes, gpu_per_node=body.config.gpu_per_node, cpu_per_node=body.config.cpu_per_node,
                   memory_per_node=body.config.memory_per_node, command=body.command or "python train.py", name=name, image=body.image,
                   env=tuple((body.env or {}).items()), secret_env=tuple((body.secret_env or {}).items()), ttl_seconds=body.ttl_seconds_after_finished,
                   priority=body.priority, grace_seconds=body.grace_seconds, deps_timeout=body.deps_timeout,
                   replace_finished=body.name is not None or body.user_id is None)
    problems += input_problems(spec, local=bool(getattr(request.app.state.portal, "local", False)))
    if problems:
        raise Problems(problems)
    done = request.app.state.portal.create(caller, spec, [Part("train.py", body.training_code.encode())])
    return _created(done)


@router.post("/trainjob/upload", response_model=CreateResponse, summary="create a TrainJob from uploaded files or one archive (.zip, .tar, .tar.gz)")
async def upload(
    request: Request, files: Annotated[list[UploadFile], File()], namespace: Annotated[str, Form()], framework: Annotated[str, Form()],
    num_nodes: Annotated[str, Form()], gpu_per_node: Annotated[str, Form()], cpu_per_node: Annotated[str, Form()] = "", memory_per_node: Annotated[str, Form()] = "",
    command: Annotated[str, Form()] = "python train.py", name: Annotated[str, Form()] = "", image: Annotated[str, Form()] = "",
) -> dict[str, Any]:
    caller = caller_of(request)
    _mutation_allowed(request, caller, json_body=False)
    problems = _namespace_problems(caller, namespace)
    parts, total = [], 0
    for f in files:
        data = await f.read(MAX_UPLOAD_BYTES + 1 - total)
        total += len(data)
        if total > MAX_UPLOAD_BYTES:
            raise Problems([{"field": "files", "problem": f"the upload is larger than {MAX_UPLOAD_BYTES} bytes"}])
        parts.append(Part(f.filename or "", data))
    spec = JobSpec(namespace=namespace, framework=framework, num_nodes=num_nodes, gpu_per_node=gpu_per_node, cpu_per_node=cpu_per_node or None, memory_per_node=memory_per_node or None,
                   command=command, name=name or None, image=image or None)
    problems += input_problems(spec, local=bool(getattr(request.app.state.portal, "local", False)))
    if problems:
        raise Problems(problems)
    from starlette.concurrency import run_in_threadpool

    return _created(await run_in_threadpool(request.app.state.portal.create, caller, spec, parts))


@router.get("/trainjob/{name}/status", summary="state (Running|Complete|Failed|Queued|Suspended|Pending), message, times, workers, progress and ETA")
def status(request: Request, name: str, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    found = request.app.state.portal.status(caller, _namespace(caller, namespace), name)
    return {**found, "state": found["status"]}  # the seed guide's clients read state; status is kept for ours


@router.get("/trainjob/{name}/logs", summary="the log of worker N (its last lines)")
def worker_logs(request: Request, name: str, namespace: str | None = None, worker: Annotated[int, Query(ge=0, le=999)] = 0, tail: Annotated[int, Query(ge=1, le=LOG_TAIL_MAX)] = 1000):
    caller = caller_of(request)
    status, body = request.app.state.portal.log_tail(caller, _namespace(caller, namespace), name, worker, tail)
    return body if status == 200 else JSONResponse(body, status_code=status)


@router.get("/trainjob/{name}/logs/stream", summary="the log of worker N as server-sent events (line, status, end; heartbeat comments)")
def worker_log_stream(request: Request, name: str, namespace: str | None = None, worker: Annotated[int, Query(ge=0, le=999)] = 0):
    caller = caller_of(request)
    gen = request.app.state.portal.log_stream(caller, _namespace(caller, namespace), name, worker, heartbeat_s=request.app.state.settings.heartbeat_s)
    return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)


@router.get("/trainjob/{name}/state/stream", summary="the job's state, workers, restarts, progress and queue position as server-sent events (state on each change, end; heartbeat comments)")
def state_stream(request: Request, name: str, namespace: str | None = None):
    caller = caller_of(request)
    settings = request.app.state.settings
    gen = request.app.state.portal.state_stream(caller, _namespace(caller, namespace), name, heartbeat_s=settings.heartbeat_s, poll_s=settings.poll_s)
    return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)


@router.get("/trainjobs/stream", summary="the namespace's TrainJobs as server-sent events (jobs on each change, end when none is left to follow)")
def jobs_stream(request: Request, namespace: str | None = None):
    caller = caller_of(request)
    settings = request.app.state.settings
    gen = request.app.state.portal.jobs_stream(caller, _namespace(caller, namespace), heartbeat_s=settings.heartbeat_s, poll_s=settings.poll_s)
    return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)


@router.get("/trainjob/{name}/progress", summary="every step event of worker 0's log: loss, throughput, step time (format: docs/progress-events.md)")
def progress_series(request: Request, name: str, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    found = request.app.state.portal.progress_series(caller, _namespace(caller, namespace), name)
    return {**found, "summary": chart.summary(found["points"])}


@router.get("/trainjob/{name}/chart.svg", summary="the chart of loss, throughput and step time by step (SVG)", response_class=Response)
def progress_chart(request: Request, name: str, namespace: str | None = None) -> Response:
    caller = caller_of(request)
    found = request.app.state.portal.progress_series(caller, _namespace(caller, namespace), name)
    return Response(chart.svg(found["points"]), media_type="image/svg+xml", headers={"Cache-Control": "no-cache", "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})


@router.delete("/trainjob/{name}", summary="delete a TrainJob (and its code ConfigMap unless another job uses it)")
def delete(request: Request, name: str, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    _not_cross_site(request)
    result = request.app.state.portal.delete(caller, _namespace(caller, namespace), name)
    return {"status": "deleted", "trainjob_name": name, "namespace": _namespace(caller, namespace), "configmap_deleted": result["configmapDeleted"]}


@router.get("/trainjobs", summary="the namespace's TrainJobs: state, progress, queue position, GPUs, age")
def list_jobs(request: Request, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    ns = _namespace(caller, namespace)
    return {"namespace": ns, "items": request.app.state.portal.list(caller, ns)}


@router.get("/trainjob/{name}/events", summary="events of the job, its pods and its Kueue Workload")
def events(request: Request, name: str, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    return {"items": request.app.state.portal.events(caller, _namespace(caller, namespace), name)}


@router.get("/trainjob/{name}/diagnosis", summary="why the job failed or does not start (trainctl diagnose)")
def diagnosis(request: Request, name: str, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    return {"findings": request.app.state.portal.diagnosis(caller, _namespace(caller, namespace), name)}


@router.get("/trainjob/{name}/queue", summary="the job's position in its team's queue (Kueue)")
def queue(request: Request, name: str, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    return request.app.state.portal.queue_position(caller, _namespace(caller, namespace), name)


@router.get("/team", summary="the team's GPU quota, used and borrowed, GPU-hours this week, the queue")
def team(request: Request, namespace: str | None = None) -> dict[str, Any]:
    caller = caller_of(request)
    return request.app.state.portal.team(caller, _namespace(caller, namespace))


@router.get("/whoami", summary="who the portal takes the caller for")
def whoami(request: Request) -> dict[str, Any]:
    caller = caller_of(request)
    return {"name": caller.name, "team": caller.team, "namespace": caller.namespace, "via": caller.via}
