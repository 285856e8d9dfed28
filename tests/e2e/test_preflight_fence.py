"""The preflight fence (k8s/pods/preflight_fence.py) against the real API server, as the CronJob's
own ServiceAccount with the RBAC the stack renders: it finds the pod a preflight ended, taints and
labels that pod's node, leaves every other node alone, and may do nothing else.

The fence's pod does not run here (kwok runs no containers): its program runs on this machine with
a token of its ServiceAccount (TokenRequest, as the kubelet would mount), against the same API."""

from __future__ import annotations

import json
import urllib.error

import pytest

from k8s.pods import preflight_fence  # shipped as the CronJob's ConfigMap
from tests.e2e.conftest import wait_for
from tools.cluster.components import KWOK_NODE_ANNOTATION
from tools.cluster.up import LOCAL_MANAGER

STACK = "dev"
BAD, GOOD = "gpu-node-bad", "gpu-node-good"


@pytest.fixture(scope="module")
def fence(clusters):
    up = clusters.get(STACK)
    cronjob = next((o for o in up.plan.objects if o["kind"] == "CronJob" and o["metadata"]["name"] == "preflight-fence"), None)
    assert cronjob is not None, "the dev stack renders the preflight-fence CronJob"
    sa = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    ns = cronjob["metadata"]["namespace"]
    admin = up.client()
    token = admin.request("POST", admin.path("v1", "ServiceAccount", sa, ns) + "/token",
                          body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}})["status"]["token"]
    # two GPU nodes only as API objects (not kwok's: nothing else acts on them)
    for name in (BAD, GOOD):
        admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"training-platform/pool": "gpu-pool"}, "annotations": {KWOK_NODE_ANNOTATION: "none"}}}, manager=LOCAL_MANAGER)
    yield up, preflight_fence.Api(up.server, token, str(up.dir / "pki" / "ca.crt"))
    for name in (BAD, GOOD):
        admin.delete("v1", "Node", name)


def _pod(admin, name: str, node: str, *, exit_code: int, message: str, where: str) -> None:
    """A trainer pod bound to ``node`` whose container ended as the kubelet reports it."""
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "training"},
        "spec": {"nodeName": node, "containers": [{"name": "node", "image": "busybox"}],
                 "tolerations": [{"operator": "Exists", "effect": "NoExecute"}]},
    }
    admin.create(pod)
    terminated = {"exitCode": exit_code, "reason": "Error", "message": message, "startedAt": "2026-11-25T03:00:00Z", "finishedAt": "2026-11-25T03:00:05Z"}
    status = {"phase": "Running", "containerStatuses": [{"name": "node", "image": "busybox", "imageID": "", "ready": False, "restartCount": 1,
                                                        "state": {"waiting": {"reason": "CrashLoopBackOff"}}, where: {"terminated": terminated}}]}
    if where == "state":
        status["containerStatuses"][0]["state"] = {"terminated": terminated}
        status["containerStatuses"][0]["restartCount"] = 0
    admin.request("PATCH", admin.path("v1", "Pod", name, "training") + "/status", body={"status": status}, content_type="application/merge-patch+json")


def test_the_fence_taints_the_node_a_preflight_failed_on_and_only_that_one(fence):
    up, api = fence
    admin = up.client()
    _pod(admin, "ddp-preflight-0", BAD, exit_code=5, message="preflight failed on node gpu-node-bad: 7 of 8 GPUs visible (the job was promised 8)", where="lastState")
    _pod(admin, "ddp-other-0", GOOD, exit_code=5, message="some program's own exit 5", where="state")  # not the preflight's message

    def fenced():
        try:
            return preflight_fence.run(api) or [n for n in (BAD, GOOD) if any(t["key"] == preflight_fence.TAINT["key"] for t in admin.get("v1", "Node", n)["spec"].get("taints") or [])]
        except urllib.error.HTTPError as err:
            raise AssertionError(f"the fence's own ServiceAccount was refused: {err.code} {err.read().decode()[:300]}") from None

    assert wait_for("the bad node fenced", fenced, up, timeout=30) == [BAD]
    node = admin.get("v1", "Node", BAD)
    assert preflight_fence.TAINT in node["spec"]["taints"]
    assert node["metadata"]["labels"][preflight_fence.REASON_LABEL] == "true"
    assert not any(t["key"] == preflight_fence.TAINT["key"] for t in admin.get("v1", "Node", GOOD)["spec"].get("taints") or [])
    assert preflight_fence.run(api) == []  # fenced once; the next run leaves it


@pytest.mark.parametrize("method,path", [
    ("DELETE", f"/api/v1/nodes/{GOOD}"),
    ("GET", "/api/v1/namespaces/training/secrets"),
    ("DELETE", "/api/v1/namespaces/training/pods/ddp-other-0"),
    ("GET", "/api/v1/namespaces/training/pods/ddp-other-0/log"),
])
def test_the_fences_service_account_may_do_nothing_else(fence, method, path):
    _, api = fence
    with pytest.raises(urllib.error.HTTPError) as err:
        api._call(method, path)
    assert err.value.code == 403, json.loads(err.value.read() or b"{}")
