"""What the portal does for a caller, on trainctl's own modules: the job model and builders
(trainctl/objects.py), submit/delete/diagnosis/progress (trainctl/jobstate.py), GPU-hours
(trainctl/usage.py) and the API access (trainctl/kube.py), every call as the caller.

The seed guide's resources per worker (``gpu_per_node``, ``cpu_per_node``, ``memory_per_node``)
become the platform's job shape: the smallest GPU instance type of the cluster's GPU pools (its
published facts; the GPU catalog without them) whose training pod, sized by the catalog
(``config/catalog.py node_pod_request``), gets at least those CPUs and GiB with that many GPUs.
"""

from __future__ import annotations

import hashlib
import math
import pathlib
import re
import shlex
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from config import catalog, trainjob_names
from config.secrets import shown
from trainctl import jobstate, objects, progress, usage
from trainctl.code import CodeError, collect
from trainctl.kube import ClusterError, KubeApi
from trainctl.portal.identity import Caller
from trainctl.portal.upload import Part, UploadError, unpack

FRAMEWORKS = {"pytorch": "torch", "torch": "torch", "tensorflow": "tensorflow"}
"""The seed guide's ``framework`` -> trainctl's runtime. MPI has no runtime here: the platform's
runtimes (k8s/builders/runtimes.py) start every program with torchrun or TF_CONFIG, DeepSpeed's
too; the form shows the choice disabled with :data:`MPI_REASON` (trainctl/portal/form.py)."""
MPI_REASON = "this platform has no MPI runtime (its runtimes start programs with torchrun, for PyTorch and DeepSpeed, or with TF_CONFIG, for TensorFlow; not with an MPI launcher such as mpirun or horovodrun)"
# trainctl's flags -> the request fields the portal names in its problems
FIELDS = {"--nodes": "config.num_nodes", "--gpus-per-node": "config.gpu_per_node", "--instance-type": "config.instance_type", "--image": "image", "--name": "name",
          "--namespace": "namespace", "--env": "env", "--secret-env": "secret_env", "--grace-seconds": "config.grace_seconds", "--priority": "priority",
          "--ttl": "ttl_seconds_after_finished"}
WEEK = timedelta(days=7)
SERIES_LINES = 20000  # the lines of worker 0's log the chart reads (its newest)


class Problems(ValueError):
    """Bad input: ``problems`` is a list of ``{"field", "problem"}``; nothing was created.
    ``status``: the HTTP status of the answer (422; 409 for a name taken)."""

    def __init__(self, problems: list[dict[str, str]], status: int = 422):
        super().__init__("; ".join(f"{p['field']}: {p['problem']}" for p in problems))
        self.problems = problems
        self.status = status


def _problem(field: str, text: str) -> dict[str, str]:
    return {"field": field, "problem": text}


def _from_trainctl(lines: list[str]) -> list[dict[str, str]]:
    """trainctl's problem lines (each names its flag first) as the portal's fields."""
    out = []
    for line in lines:
        flag = line.split(" ", 1)[0].rstrip(":")
        field = FIELDS.get(flag, "request")
        out.append(_problem(field, line[len(flag):].lstrip(" :") if flag in FIELDS else line))
    return out


@dataclass(frozen=True)
class JobSpec:
    """A submission as the portal takes it (the seed guide's request, plus the form's extras)."""

    namespace: str
    framework: str
    num_nodes: Any
    gpu_per_node: Any
    cpu_per_node: Any = None
    memory_per_node: Any = None
    command: str = "python train.py"
    name: str | None = None
    image: str | None = None
    instance_type: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the job's variables (config/job_env.py rules, as trainctl's --env)
    secret_env: tuple[tuple[str, str], ...] = ()  # NAME, SECRET/KEY (--secret-env)
    ttl_seconds: Any = None  # delete the job this long after it finishes (--ttl); None: the platform's retention
    replace_finished: bool = True  # a finished job of the name is replaced (a resubmit); False for a name made for the request


def _int(field: str, value: Any, problems: list, *, lo: int, hi: int, required: bool = True) -> int | None:
    if value is None or value == "":
        if required:
            problems.append(_problem(field, "required"))
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        problems.append(_problem(field, "allowed: a whole number"))
        return None
    if isinstance(value, str) and not value.strip().isascii():  # int() takes other scripts' digits too
        problems.append(_problem(field, "allowed: a whole number"))
        return None
    try:
        n = int(value)
    except ValueError:
        problems.append(_problem(field, "allowed: a whole number"))
        return None
    if not lo <= n <= hi:
        problems.append(_problem(field, f"{n}: allowed: {lo} to {hi}"))
        return None
    return n


# a Kubernetes quantity (apimachinery resource.Quantity: a signed decimal, then a binary or decimal
# suffix or an exponent); the sign is left out: no resource here may be negative
_QUANTITY_RE = re.compile(r"^(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?\d{1,3})?$", re.ASCII)


def _quantity(field: str, value: Any, problems: list, *, unit: int, lo: int, hi: int) -> int | None:
    """A whole number of ``unit`` (rounded up) from a number in those units or a Kubernetes quantity
    string (the seed guide sends ``"memory_per_node": "16Gi"``; ``"4"``, ``"500m"``, ``"16G"`` too):
    ``unit`` is 1 for CPUs and 2**30 for GiB of memory. A bare number (``16``, ``"16"``) is in units,
    as the form's fields are."""
    if isinstance(value, str) and value.strip() and not (value.strip().isascii() and value.strip().isdigit()):
        from decimal import Decimal

        from kubernetes.utils import parse_quantity

        what = f"a whole number{' of GiB' if unit > 1 else ''} or a Kubernetes quantity ({'16Gi, 64G' if unit > 1 else '4, 500m'})"
        text = value.strip()
        if len(text) > 40 or not _QUANTITY_RE.fullmatch(text):  # Kubernetes' own form (no NaN, Infinity, 1_6 that Decimal takes)
            problems.append(_problem(field, f"{shown(value[:40])}: allowed: {what}"))
            return None
        try:
            plain = _QUANTITY_RE.fullmatch(text).group(3) is None  # type: ignore[union-attr]  (matched above)
            amount = Decimal(text) * unit if plain else parse_quantity(text)  # a bare number is in units, as the form's fields
        except (ValueError, ArithmeticError):
            problems.append(_problem(field, f"{shown(value[:40])}: allowed: {what}"))
            return None
        # compared as Decimals first: 1e999999 is a short string and a huge integer
        if not amount.is_finite() or not Decimal((lo - 1) * unit) < amount <= Decimal(hi * unit):
            problems.append(_problem(field, f"{shown(value[:40])}: allowed: {lo} to {hi}{' GiB' if unit > 1 else ''}"))
            return None
        return int(math.ceil(amount / unit))
    return _int(field, value, problems, lo=lo, hi=hi, required=False)


def guide_name(user_id: str, num_nodes: Any, when: datetime) -> str:
    """The seed guide's TrainJob name, ``<user_id>-job-<YYYYMMDDHHMMSS>`` (UTC), for a request that
    gives ``user_id`` and no name. A user id that is not a label is made one as a code directory's
    name is (config/trainjob_names.py ``label_from``: ``alice@example.com`` ->
    ``alice-example-com-<hash8>``, apart from ``alice-example-com``), cut so that the name and its
    pods' names fit."""
    stamp = when.astimezone(UTC).strftime("%Y%m%d%H%M%S")
    nodes = num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) and 1 <= num_nodes <= 1000 else 1
    suffix = f"-job-{stamp}"
    return trainjob_names.label_from(user_id, trainjob_names.name_max(nodes) - len(suffix), default="user") + suffix


def pick_instance_type(gpus: int, cpus: int | None, memory_gib: int | None, types: list[str]) -> str | None:
    """The smallest of ``types`` whose training pod of ``gpus`` GPUs gets at least ``cpus`` and
    ``memory_gib`` (the catalog's sizing), or None."""
    fits = []
    for t in types:
        info = catalog.catalog().get(t)
        if info is None or info.gpus < gpus:
            continue
        cpu, mem = catalog.node_pod_request(info, gpus)
        if (cpus is None or cpu >= cpus) and (memory_gib is None or mem >= memory_gib):
            fits.append((info.gpus, info.vcpu, info.memory_gib, t))
    return min(fits)[3] if fits else None


def pool_types(facts: dict | None) -> list[str]:
    """The instance types the cluster's GPU pools (not the EFA pools) launch; the catalog without facts."""
    if facts and facts.get("pools"):
        return sorted({t for p in facts["pools"] if not p.get("efa") for t in p.get("instanceTypes") or []})
    return sorted(catalog.catalog())


def request_of(spec: JobSpec, facts: dict | None, *, local: bool = False) -> objects.Request:
    """The trainctl request of a submission, every problem at once (:class:`Problems`); ``local``:
    a run on this machine (``trainctl ui --local``), judged as ``trainctl submit --local``."""
    problems: list[dict[str, str]] = []
    runtime = FRAMEWORKS.get(str(spec.framework).lower())
    if runtime is None:
        extra = f" (MPI: {MPI_REASON})" if str(spec.framework).lower() == "mpi" else ""
        problems.append(_problem("framework", f"{shown(str(spec.framework)[:40])}: allowed: pytorch, tensorflow{extra}"))
    nodes = _int("config.num_nodes", spec.num_nodes, problems, lo=1, hi=1000)
    gpus = _int("config.gpu_per_node", spec.gpu_per_node, problems, lo=1, hi=max(i.gpus for i in catalog.catalog().values()))
    cpus = _quantity("config.cpu_per_node", spec.cpu_per_node, problems, unit=1, lo=1, hi=max(i.vcpu for i in catalog.catalog().values()))
    memory = _quantity("config.memory_per_node", spec.memory_per_node, problems, unit=2**30, lo=1, hi=max(i.memory_gib for i in catalog.catalog().values()))
    ttl = _int("ttl_seconds_after_finished", spec.ttl_seconds, problems, lo=0, hi=10**9, required=False)
    if ttl is not None and local:
        problems.append(_problem("ttl_seconds_after_finished", "not in local mode (a local job stays until it is deleted)"))
    try:
        command = shlex.split(spec.command or "")
    except ValueError as err:
        problems.append(_problem("command", f"not a command line ({err})"))
        command = []
    itype = spec.instance_type or objects.DEFAULT_INSTANCE_TYPE
    given = catalog.catalog().get(spec.instance_type or "")
    if given is not None and gpus is not None and given.gpus >= gpus and (cpus is not None or memory is not None):  # a type named beside the resources it must give
        cpu, mem = catalog.node_pod_request(given, gpus)
        if (cpus is not None and cpu < cpus) or (memory is not None and mem < memory):
            problems.append(_problem("config.instance_type", f"{spec.instance_type}: a worker of {gpus} GPUs gets {cpu} CPUs and {mem} GiB there, less than the {cpus or 'any'} CPUs and "
                                                             f"{memory or 'any'} GiB asked; allowed: a larger type, or none (the smallest type of the cluster that gives them)"))
    if spec.instance_type is None and gpus is not None:
        types = pool_types(facts)
        found = pick_instance_type(gpus, cpus, memory, types)
        if found is None:
            problems.append(_problem("config", f"no GPU instance type of this cluster gives a worker {gpus} GPUs, {cpus or 'any'} CPUs and {memory or 'any'} GiB (its types: {', '.join(types[:8])}{', ...' if len(types) > 8 else ''})"))
        else:
            itype = found
    req = objects.Request(namespace=str(spec.namespace), nodes=nodes or 1, command=command, runtime=runtime or "torch", gpus_per_node=gpus, instance_type=itype, image=spec.image or None, name=spec.name or None,
                              env=tuple(spec.env), secret_env=tuple(spec.secret_env), local=local, ttl_seconds=ttl)
    problems += [p for p in _from_trainctl(objects.problems(req)) if not any(q["field"] == p["field"] for q in problems)]
    if problems:
        raise Problems(problems)
    return req


def code_bundle(files: list[Part], name: str | None):
    """The upload as trainctl's code bundle (trainctl/code.py ``collect`` with its limits), named
    after the job, not the temporary directory it was unpacked in; :class:`Problems` when refused."""
    with tempfile.TemporaryDirectory(prefix="portal-upload-") as tmp:
        root = pathlib.Path(tmp) / (name or "code")
        root.mkdir()
        try:
            unpack(files, root)
            bundle = collect(root)
        except (UploadError, CodeError) as err:
            raise Problems([_problem("training_code", line.replace(str(root), "the upload")) for line in str(err).splitlines()]) from None
    return replace(bundle, root=pathlib.Path(name or "job"))


def _when(ts: str | None) -> datetime | None:
    return usage.parse_time(ts) if ts else None


class Portal:
    """The portal's cluster access: one API client per identity (cached: a request reuses the
    connections of the last one with the same identity), every call as that identity. The routes
    call what trainctl/portal/backend.py names; trainctl/portal/local_service.py answers the same
    for the jobs of this machine (``trainctl ui --local``)."""

    mode_note: str | None = None  # a line for the page header (local mode says so)
    local = False  # the jobs run on a cluster

    def __init__(self, base: client.Configuration, *, base_headers: dict[str, list[str]] | None = None, cache_size: int = 64):
        self.base = base
        self.base_headers = base_headers or {}
        self._clients: OrderedDict[tuple, KubeApi] = OrderedDict()
        self._lock = threading.Lock()
        self._cache_size = cache_size

    def kube(self, caller: Caller, namespace: str) -> KubeApi:
        headers = caller.headers or self.base_headers
        key = (namespace, tuple(sorted((k, tuple(v)) for k, v in headers.items())), hashlib.sha256(caller.token.encode()).hexdigest() if caller.token else None)
        with self._lock:
            found = self._clients.get(key)
            if found is not None:
                self._clients.move_to_end(key)
                return found
        cfg = self.base
        if caller.token is not None:  # the caller's own token, nothing of the portal's
            cfg = client.Configuration()
            cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = self.base.host, self.base.ssl_ca_cert, self.base.verify_ssl
            cfg.api_key = {"authorization": f"Bearer {caller.token}"}
        api = KubeApi(namespace=namespace, configuration=cfg, headers=headers or {"User-Agent": ["training-platform-portal"]})
        with self._lock:
            self._clients[key] = api
            while len(self._clients) > self._cache_size:
                self._clients.popitem(last=False)
        return api

    # --- jobs ----------------------------------------------------------------------------------

    def create(self, caller: Caller, spec: JobSpec, files: list[Part]) -> dict[str, Any]:
        kube = self.kube(caller, spec.namespace)
        req = request_of(spec, None)  # every input problem before any cluster read
        facts = kube.platform_facts()
        if spec.instance_type is None:
            req = request_of(spec, facts)
        with tempfile.TemporaryDirectory(prefix="portal-upload-") as tmp:
            root = pathlib.Path(tmp) / (req.name or "code")
            root.mkdir()
            try:
                unpack(files, root)
                bundle = collect(root)
                bundle = replace(bundle, root=pathlib.Path(req.name or "job"))
                done = jobstate.submit(kube, req, bundle, instance_type_given=True, replace_finished_job=spec.replace_finished)
            except (UploadError, CodeError) as err:
                raise Problems([_problem("training_code", line.replace(str(root), "the upload")) for line in str(err).splitlines()]) from None
            except objects.SubmitError as err:
                raise Problems(_from_trainctl([line.replace(str(root), "the upload") for line in str(err).splitlines()])) from None
        return {**done, "instanceType": req.instance_type}

    def delete(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        return jobstate.delete(self.kube(caller, namespace), name, direct=True)

    def status(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        kube = self.kube(caller, namespace)
        tj = kube.get_trainjob(name)
        refused: list[str] = []  # reads the caller may not make: named, never taken for "none" (as trainctl status)
        pods = jobstate.readable(refused, kube.pods, name, default=[])
        own, of_pods, of_workloads = jobstate.job_events(kube, name, refused=refused)
        started, finished = jobstate.times(tj, pods)
        state = jobstate.phase(tj)
        failure = jobstate.last_failure(tj, pods, own)
        queue = jobstate.queue_report(kube, tj, refused=refused)
        report = jobstate.status_report(tj, pods, own, of_workloads, [], queue=queue)
        message = failure if state == "Failed" and failure else report["admission"]
        out: dict[str, Any] = {
            "trainjob_name": name, "namespace": namespace, "status": "Pending" if state == "Created" else state, "message": message,
            "created_at": tj["metadata"].get("creationTimestamp"), "started_at": started, "completed_at": finished,
            "nodes": (tj["spec"].get("trainer") or {}).get("numNodes"), "gpus": gpus_of(tj), "restarts": jobstate.restarts(pods), "last_failure": failure,
            "workers": [worker_state(p) for p in sorted(pods, key=lambda p: p["metadata"]["name"])],
        }
        found = jobstate.progress_of(kube, tj, pods)
        out["progress"] = found
        out["progress_text"] = progress.text(found)
        out["priority"] = queue.get("priority")
        if state == "Queued":
            out["queue"] = queue.get("positionDetail") or self.queue_position(caller, namespace, name)
            out["queue_text"] = queue.get("position")
        out["not_allowed"] = list(dict.fromkeys(refused))
        return out

    def list(self, caller: Caller, namespace: str, *, with_progress: bool = True) -> list[dict[str, Any]]:
        kube = self.kube(caller, namespace)
        jobs = sorted(kube.list_trainjobs(), key=lambda t: t["metadata"].get("creationTimestamp") or "", reverse=True)
        now = datetime.now(UTC)
        queue = self._pending(kube) if any(jobstate.phase(t) == "Queued" for t in jobs) else None
        rows = []
        for t in jobs:
            state = jobstate.phase(t)
            created = _when(t["metadata"].get("creationTimestamp"))
            row = {
                "trainjob_name": t["metadata"]["name"], "status": "Pending" if state == "Created" else state, "nodes": (t["spec"].get("trainer") or {}).get("numNodes"),
                "gpus": gpus_of(t), "created_at": t["metadata"].get("creationTimestamp"), "age_s": int((now - created).total_seconds()) if created else None,
                "progress": progress.text(jobstate.progress_of(kube, t)) if with_progress and state == "Running" else "-",
            }
            if queue is not None and state == "Queued":
                row["queue"] = _position(queue, t["metadata"]["name"])
            rows.append(row)
        return rows

    def events(self, caller: Caller, namespace: str, name: str) -> list[dict[str, Any]]:
        kube = self.kube(caller, namespace)
        kube.get_trainjob(name)  # a job the caller may read
        own, of_pods, of_workloads = jobstate.job_events(kube, name)
        rows = [
            {"time": e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp"), "type": e.get("type"), "reason": e.get("reason"),
             "object": f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}", "message": e.get("message"), "count": e.get("count")}
            for e in own + of_pods + of_workloads
        ]
        return sorted(rows, key=lambda r: r["time"] or "")

    def diagnosis(self, caller: Caller, namespace: str, name: str) -> list[dict[str, Any]]:
        from trainctl import diagnose

        return [f.as_dict() for f in diagnose.diagnose(jobstate.evidence(self.kube(caller, namespace), name))]

    # --- queue and team ----------------------------------------------------------------------------

    def _pending(self, kube: KubeApi) -> dict[str, Any]:
        """The LocalQueue's pending Workloads in Kueue's order, as trainctl status reads them (trainctl/jobstate.py pending_queue)."""
        return jobstate.pending_queue(kube)

    def queue_position(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        kube = self.kube(caller, namespace)
        kube.get_trainjob(name)
        return _position(self._pending(kube), name)

    def team(self, caller: Caller, namespace: str) -> dict[str, Any]:
        """GPUs in use: what the namespace's running jobs ask for (:func:`gpus_of`); the quota: the
        team's (the stack's ``tenants.<team>.gpuQuota``, the nominal quota of its Kueue ClusterQueue);
        borrowed: what Kueue admitted beyond it (trainctl/usage.py ``borrowed``); GPU-hours from Kueue's Workloads."""
        kube = self.kube(caller, namespace)
        now = datetime.now(UTC)
        try:
            workloads = kube.all_workloads(all_namespaces=False)
            jobs = [t for t in kube.list_trainjobs() if jobstate.phase(t) == "Running"]
        except ClusterError as err:
            return {"namespace": namespace, "team": caller.team, "error": str(err)}
        admitted = [r for r in usage.rows(workloads, since=now - timedelta(seconds=1), now=now) if r.end is None]
        week = usage.rows(workloads, since=now - WEEK, now=now)
        quota = caller.gpu_quota
        if quota is None:
            quota = (kube.platform_facts() or {}).get("gpuQuota")
        since = {r.job: r.start.isoformat(timespec="seconds") for r in admitted}
        running = [{"job": t["metadata"]["name"], "gpus": gpus_of(t) or 0, "since": since.get(t["metadata"]["name"]) or t["metadata"].get("creationTimestamp")} for t in jobs]
        return {
            "namespace": namespace, "team": caller.team, "local": False, "gpu_quota": quota, "gpus_used": sum(r["gpus"] for r in running),
            "gpus_borrowed": usage.borrowed(workloads, quota) if quota is not None else None,
            "gpu_hours_week": round(sum(r.gpu_hours for r in week), 3), "since": (now - WEEK).isoformat(timespec="seconds"), "queue": self._pending(kube), "running": running,
        }

    # --- logs ------------------------------------------------------------------------------------

    def submitted_form(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        """What the job was submitted with (Clone & edit): its TrainJob and its code ConfigMap
        (``data``, ``binaryData`` base64 as the API has it), or None with why it could not be read."""
        kube = self.kube(caller, namespace)
        tj = kube.get_trainjob(name)
        cm = objects.code_configmap_of(tj)
        if not cm:
            return {"trainjob": tj, "configmap": None, "code_problem": "the job mounts no code ConfigMap"}
        try:
            found: Any = kube.core.read_namespaced_config_map(cm, namespace)
        except Exception as err:  # noqa: BLE001  (the code may be gone: the form stays editable, and says so)
            why = f"HTTP {err.status}" if isinstance(err, client.ApiException) else type(err).__name__
            return {"trainjob": tj, "configmap": None, "code_problem": f"its code ConfigMap {cm} could not be read ({why})"}
        return {"trainjob": tj, "configmap": {"data": dict(found.data or {}), "binaryData": dict(found.binary_data or {})}, "code_problem": None}

    def log_tail(self, caller: Caller, namespace: str, name: str, worker: int, tail: int) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): the last ``tail`` lines of worker N's pod; 410 when a finished job's pods are gone."""
        from trainctl.portal.logs import GONE

        kube, tj, pod = self.worker_pod(caller, namespace, name, worker)
        state = jobstate.phase(tj)
        head = {"trainjob_name": name, "namespace": namespace, "worker": worker}
        if pod is None:
            if state in ("Complete", "Failed"):
                return 410, {**head, "logs": None, "message": GONE}
            return 200, {**head, "logs": "", "message": f"worker {worker} has no pod yet ({'Pending' if state == 'Created' else state})"}
        try:
            resp = kube.pod_log(pod["metadata"]["name"], follow=False, tail_lines=tail)
            text = resp.data.decode("utf-8", errors="replace")
        except ClusterError as err:
            if "(HTTP 400)" in str(err):  # the container has not started
                return 200, {**head, "logs": "", "message": f"worker {worker}'s container has not started"}
            raise
        return 200, {**head, "pod": pod["metadata"]["name"], "logs": text}

    def log_stream(self, caller: Caller, namespace: str, name: str, worker: int, *, heartbeat_s: float):
        """Worker N's log as server-sent events (trainctl/portal/logs.py); may the caller read it,
        is the worker in range: answered here, before the stream starts."""
        from trainctl.portal import logs

        self.worker_pod(caller, namespace, name, worker)
        return logs.stream(self, caller, namespace, name, worker, heartbeat_s=heartbeat_s)

    def state_stream(self, caller: Caller, namespace: str, name: str, *, heartbeat_s: float, poll_s: float):
        """The job's state as server-sent events (trainctl/portal/live.py), every read a
        :meth:`status` as the caller; the first before the stream starts (a refusal is its HTTP status)."""
        from trainctl.portal import live

        first = self.status(caller, namespace, name)
        return live.job_stream(lambda: self.status(caller, namespace, name), first, name=name, heartbeat_s=heartbeat_s, poll_s=poll_s)

    def jobs_stream(self, caller: Caller, namespace: str, *, heartbeat_s: float, poll_s: float):
        """The namespace's jobs as server-sent events, every read a :meth:`list` as the caller."""
        from trainctl.portal import live

        first = self.list(caller, namespace)
        return live.list_stream(lambda: self.list(caller, namespace), first, namespace=namespace, heartbeat_s=heartbeat_s, poll_s=poll_s)

    def progress_series(self, caller: Caller, namespace: str, name: str) -> dict[str, Any]:
        """Every step event of worker 0's log (its last ``SERIES_LINES`` lines; trainctl/progress.py ``series``)."""
        kube, _tj, pod = self.worker_pod(caller, namespace, name, 0)
        lines = kube.log_tail(pod["metadata"]["name"], lines=SERIES_LINES) if pod is not None else []
        return {"trainjob_name": name, "namespace": namespace, "source": "the log of worker 0", "points": progress.series(lines)}

    def worker_pod(self, caller: Caller, namespace: str, name: str, worker: int) -> tuple[KubeApi, dict, dict | None]:
        """(client, TrainJob, the pod of worker N or None). Raises Problems for a worker out of range."""
        kube = self.kube(caller, namespace)
        tj = kube.get_trainjob(name)
        nodes = int((tj["spec"].get("trainer") or {}).get("numNodes") or 1)
        if not 0 <= worker < nodes:
            raise Problems([_problem("worker", f"{worker}: allowed: 0 to {nodes - 1} ({name} has {nodes} workers)")])
        pods = [p for p in kube.pods(name) if _worker_index(p) == worker]
        pods.sort(key=lambda p: (int((p["metadata"].get("labels") or {}).get(jobstate.RESTART_LABEL, 0)), p["metadata"].get("creationTimestamp") or ""))
        return kube, tj, (pods[-1] if pods else None)


REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
"""The JobSet replicated job of a pod (kubernetes-sigs/jobset api/jobset/v1alpha2 ReplicatedJobNameKey);
the Trainer's node job is ``node`` (kubeflow/trainer pkg/constants Node)."""
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""An indexed Job's pod index (Kubernetes batch/v1 JobCompletionIndexAnnotation, also a label since 1.28)."""


def _worker_index(pod: dict) -> int | None:
    labels = pod["metadata"].get("labels") or {}
    if labels.get(REPLICATED_JOB_LABEL) != "node":
        return None
    try:
        return int(labels.get(INDEX_LABEL, ""))
    except ValueError:
        return None


def worker_state(pod: dict) -> dict[str, Any]:
    status = pod.get("status") or {}
    waiting = next((cs["state"]["waiting"].get("reason") for cs in status.get("containerStatuses") or [] if (cs.get("state") or {}).get("waiting")), None)
    return {"pod": pod["metadata"]["name"], "worker": _worker_index(pod), "phase": status.get("phase"), "waiting": waiting, "node": (pod.get("spec") or {}).get("nodeName"),
            "restarts": sum(cs.get("restartCount", 0) for cs in status.get("containerStatuses") or [])}


def gpus_of(tj: dict) -> int | None:
    """GPUs the job asks for: nodes times GPUs per node (``numProcPerNode`` on the torch runtime, as trainctl writes it)."""
    trainer = tj["spec"].get("trainer") or {}
    per = ((trainer.get("resourcesPerNode") or {}).get("limits") or {}).get("nvidia.com/gpu")
    try:
        return int(trainer.get("numNodes") or 1) * int(per) if per is not None else None
    except (TypeError, ValueError):
        return None


_position = jobstate.queue_position  # one copy: trainctl status and the portal place a job alike
