"""Fence the nodes a preflight failed on: run every two minutes by a CronJob in platform-ops.

The launcher's preflight (workloads/programs/launch.py) ends a trainer container with exit code 5
and the termination message ``preflight failed on node <node>: <why>`` when the node's GPUs or EFA
devices are not what the job was promised or its GPU check fails. The job restarts (retryable),
and without a fence its pods could land on the same node again. This program taints such a node
``training-platform/preflight-failed=true:NoSchedule`` and labels it with the reason: no new pod is
placed there, the node empties, and Karpenter's consolidation removes it (the repair path for what
the node monitoring agent does not report). Standard library only; the pod's ServiceAccount may
list pods and get and patch nodes, nothing else.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator

PREFLIGHT_EXIT = 5  # launch.PREFLIGHT_FAILED
PREFIX = "preflight failed on node "
TAINT = {"key": "training-platform/preflight-failed", "value": "true", "effect": "NoSchedule"}
REASON_LABEL = "training-platform/preflight-failed"
_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def failed_preflights(pods: Iterable[dict]) -> dict[str, str]:
    """Node -> the preflight's message, for every container a preflight ended (now or before a
    restart: ``state`` or ``lastState``). The node is the pod's own ``spec.nodeName``."""
    found: dict[str, str] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for where in ("state", "lastState"):
                t = (cs.get(where) or {}).get("terminated") or {}
                if node and t.get("exitCode") == PREFLIGHT_EXIT and (t.get("message") or "").startswith(PREFIX):
                    found[node] = t["message"]
    return found


def fence_patch(node: dict) -> dict | None:
    """The merge patch that taints and labels ``node``; None when it is fenced already. The whole
    taint list is sent (a merge patch replaces lists), guarded by the node's resourceVersion."""
    taints = (node.get("spec") or {}).get("taints") or []
    if any(t.get("key") == TAINT["key"] for t in taints):
        return None
    return {
        "metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "labels": {REASON_LABEL: "true"}},
        "spec": {"taints": [*taints, TAINT]},
    }


class Api:
    def __init__(self, host: str, token: str, ca_file: str):
        self.base, self.token, self.ctx = host.rstrip("/"), token, ssl.create_default_context(cafile=ca_file)

    @classmethod
    def in_cluster(cls) -> Api:
        with open(f"{_SA_DIR}/token") as fh:
            token = fh.read().strip()
        return cls(f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}", token, f"{_SA_DIR}/ca.crt")

    def _call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type})
        with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def pods(self) -> Iterator[dict]:
        token = ""
        while True:
            page = self._call("GET", "/api/v1/pods?" + urllib.parse.urlencode({"limit": "500", **({"continue": token} if token else {})}))
            yield from page.get("items", [])
            token = page.get("metadata", {}).get("continue", "")
            if not token:
                return

    def node(self, name: str) -> dict:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def patch_node(self, name: str, patch: dict) -> None:
        self._call("PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")


def run(api: Api) -> list[str]:
    fenced = []
    for node_name, message in failed_preflights(api.pods()).items():
        try:
            patch = fence_patch(api.node(node_name))
            if patch is not None:
                api.patch_node(node_name, patch)
                print(json.dumps({"fenced": node_name, "reason": message}), flush=True)
                fenced.append(node_name)
        except urllib.error.HTTPError as err:
            if err.code not in (404, 409):  # the node is gone, or changed meanwhile (next run)
                raise
    return fenced


if __name__ == "__main__":
    run(Api.in_cluster())
    sys.exit(0)
