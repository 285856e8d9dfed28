"""Delete finished TrainJobs some time after they finish: run by a CronJob every 10 minutes.

Shipped as the CronJob's ConfigMap and run with the Python standard library only, against the
API server with the pod's service account (list and delete TrainJobs, nothing else).

Why a CronJob of our own: Kubeflow Trainer v2.3.0's TrainJob has no TTL (``ttlSecondsAfterFinished``
on TrainJobSpec is tracked in kubeflow/trainer#4052, KEP-2899, not released); a TTL on the JobSet
(the runtime's ``ttlSecondsAfterFinished``) deletes the JobSet only, which the Trainer then
recreates (kubeflow/trainer#2991, #3779). Kyverno's ClusterCleanupPolicy could express the rule,
but installs a policy engine with admission webhooks in the API path for this one task, and
kube-janitor counts its TTL from creation, not from the finish. What exists for "run this every
hour" is Kubernetes' CronJob; the selection rule below is small and tested.

The rule: a TrainJob is finished when its ``Complete`` or ``Failed`` condition is ``True``, and
expired once that condition's ``lastTransitionTime`` lies its retention back: the seconds its
``TTL_ANNOTATION`` asks for (``trainctl submit --ttl``), at most ``RETENTION_MAX``, else the
stack's ``RETENTION`` (``Never``: kept unless the job asks). The stack's
own TrainJobs (label ``training-platform/job`` with a stack job kind) are never touched: Pulumi
owns their lifecycle, and deleting them would make the next ``pulumi up --refresh`` create and run
them again. Deletion is by uid precondition (a job re-created under the same name survives) with
background propagation (the JobSet, its Jobs and pods, and objects the TrainJob owns follow).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from datetime import datetime

GROUP_VERSION = "trainer.kubeflow.org/v1alpha1"
FINISHED = ("Complete", "Failed")
_DURATION = re.compile(r"(\d+)(s|m|h)")
_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def parse_duration(text: str) -> float | None:
    """Seconds of a duration such as ``168h`` or ``1h30m``; None for ``Never``."""
    if text == "Never":
        return None
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use Never or e.g. 168h, 30m)")
    return float(sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in parts))


def finished_at(trainjob: dict) -> float | None:
    """When the TrainJob finished (epoch seconds), or None while it has not."""
    for cond in trainjob.get("status", {}).get("conditions", []) or []:
        if cond.get("type") in FINISHED and cond.get("status") == "True" and cond.get("lastTransitionTime"):
            return datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    return None


def retention_of(trainjob: dict, *, retention_s: float | None, max_s: float | None, ttl_annotation: str) -> float | None:
    """How long after it finished the job is kept: what its annotation asks (a whole number of
    seconds; anything else is ignored), never more than ``max_s``; else ``retention_s``. None: kept."""
    asked = (trainjob.get("metadata", {}).get("annotations") or {}).get(ttl_annotation)
    if isinstance(asked, str) and asked.isascii() and asked.isdigit():
        return float(asked) if max_s is None else min(float(asked), max_s)
    if asked is not None:  # said, so whoever wrote it by hand learns why the job stays
        meta = trainjob.get("metadata", {})
        print(json.dumps({"ignored": f"{meta.get('namespace')}/{meta.get('name')}", "annotation": ttl_annotation, "why": "not a whole number of seconds"}), flush=True)
    return retention_s


def expired(trainjobs: Iterable[dict], *, now: float, retention_s: float | None, keep_kinds: Iterable[str], job_label: str, keep_namespace: str,
            max_s: float | None = None, ttl_annotation: str = "") -> Iterator[dict]:
    """The TrainJobs to delete: finished their retention (:func:`retention_of`) or more before
    ``now``, and not the stack's own (a job kind of the stack, in the stack's namespace: a team's
    job carrying such a label is still cleaned)."""
    keep = set(keep_kinds)
    for tj in trainjobs:
        meta = tj.get("metadata", {})
        if meta.get("namespace") == keep_namespace and meta.get("labels", {}).get(job_label) in keep:
            continue
        done = finished_at(tj)
        kept = retention_of(tj, retention_s=retention_s, max_s=max_s, ttl_annotation=ttl_annotation) if ttl_annotation else retention_s
        if done is not None and kept is not None and now - done >= kept:
            yield tj


class Api:
    """The few API calls the cleanup makes, with the pod's service account."""

    def __init__(self, host: str, token: str, ca_file: str):
        self.base = host.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca_file)

    @classmethod
    def in_cluster(cls) -> Api:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        with open(f"{_SA_DIR}/token") as fh:
            token = fh.read().strip()
        return cls(f"https://{host}:{port}", token, f"{_SA_DIR}/ca.crt")

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def list_trainjobs(self, label_selector: str) -> Iterator[dict]:
        token = ""
        while True:
            query = {"limit": "200", "labelSelector": label_selector, **({"continue": token} if token else {})}
            page = self._call("GET", f"/apis/{GROUP_VERSION}/trainjobs?{urllib.parse.urlencode(query)}")
            yield from page.get("items", [])
            token = page.get("metadata", {}).get("continue", "")
            if not token:
                return

    def delete_trainjob(self, namespace: str, name: str, uid: str) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background", "preconditions": {"uid": uid}}
        self._call("DELETE", f"/apis/{GROUP_VERSION}/namespaces/{namespace}/trainjobs/{name}", body)


def run(api: Api, *, now: float, retention_s: float | None, keep_kinds: list[str], job_label: str, keep_namespace: str, dry_run: bool = False,
        max_s: float | None = None, ttl_annotation: str = "") -> list[str]:
    deleted = []
    for tj in expired(api.list_trainjobs(""), now=now, retention_s=retention_s, keep_kinds=keep_kinds, job_label=job_label, keep_namespace=keep_namespace, max_s=max_s, ttl_annotation=ttl_annotation):
        meta = tj["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        if not dry_run:
            try:
                api.delete_trainjob(meta["namespace"], meta["name"], meta["uid"])
            except urllib.error.HTTPError as err:
                if err.code not in (404, 409):  # gone already, or re-created under the same name
                    raise
                continue
        print(json.dumps({"deleted": ref, "finished_at": finished_at(tj), "dry_run": dry_run}), flush=True)
        deleted.append(ref)
    return deleted


def main() -> int:
    retention_s = parse_duration(os.environ["RETENTION"])
    max_s = parse_duration(os.environ.get("RETENTION_MAX", "Never"))
    keep = [k for k in os.environ.get("KEEP_JOB_KINDS", "").split(",") if k]
    run(Api.in_cluster(), now=time.time(), retention_s=retention_s, keep_kinds=keep, job_label=os.environ["JOB_LABEL"], keep_namespace=os.environ["KEEP_NAMESPACE"],
        dry_run=os.environ.get("DRY_RUN") == "true", max_s=max_s, ttl_annotation=os.environ.get("TTL_ANNOTATION", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
