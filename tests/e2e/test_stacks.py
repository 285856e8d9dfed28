"""Every stack applied to a real API server with the real controllers: objects accepted and kept
whole, each TrainJob -> JobSet -> pods on nodes that satisfy them -> Complete, Kueue admission into
flavors whose NodePool can launch the job."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import wait_for
from tools.cluster import sim
from tools.cluster.apply import label

STACKS = ["dev", "prod", "workshop", "teams"]
TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")


@pytest.mark.parametrize("stack", STACKS)
def test_every_object_is_accepted_and_nothing_is_pruned(clusters, stack):
    up = clusters.get(stack)
    assert up.outcome.problems == []
    assert up.outcome.applied == len(up.plan.objects) > 0
    client = up.client()
    for obj in up.plan.objects:
        meta = obj["metadata"]
        assert client.get_or_none(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")) is not None, label(obj)


def _conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}


def _matches(node: dict, term: dict) -> bool:
    labels = node["metadata"].get("labels", {})
    for expr in term.get("matchExpressions", []):
        value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values", [])
        ok = {"In": value in values, "NotIn": value not in values, "Exists": value is not None, "DoesNotExist": value is None}.get(op)
        if not ok:
            return False
    return True


def node_satisfies(node: dict, pod: dict) -> list[str]:
    """What of the pod's scheduling constraints the node does not meet (empty: all met)."""
    spec = pod["spec"]
    labels = node["metadata"].get("labels", {})
    problems = [f"nodeSelector {k}={v} (node has {labels.get(k)!r})" for k, v in (spec.get("nodeSelector") or {}).items() if labels.get(k) != v]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if required and not any(_matches(node, t) for t in required):
        problems.append("required node affinity")
    tolerations = spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint["effect"] not in ("NoSchedule", "NoExecute") or taint["key"].startswith("node.kubernetes.io/"):
            continue
        if not any(t.get("operator") == "Exists" and not t.get("key") or (t.get("key") == taint["key"] and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))) for t in tolerations):
            problems.append(f"untolerated taint {taint['key']}")
    return problems


def _launchable(node_pool: dict, instance_type: str) -> bool:
    for req in node_pool["spec"]["template"]["spec"]["requirements"]:
        if req["key"] == "node.kubernetes.io/instance-type":
            return (instance_type in req["values"]) == (req["operator"] == "In")
    return True


@pytest.mark.parametrize("stack", STACKS)
def test_trainjobs_run_on_nodes_that_fit_and_complete(clusters, stack):
    up = clusters.get(stack)
    client = up.client()
    jobs = [o for o in up.plan.objects if o["kind"] == "TrainJob"]
    assert jobs, f"{stack} renders no TrainJob"
    pools = {p["spec"]["template"]["metadata"]["labels"].get("training-platform/pool"): p for p in up.plan.objects if p["kind"] == "NodePool"}
    for job in jobs:
        _follow(up, client, job, pools)


def _follow(up, client, job: dict, pools: dict[str, dict]) -> None:
    """One TrainJob: its JobSet, its Workload's flavors (with Kueue), its pods on fitting nodes, Complete."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    wait_for(f"the JobSet of {ns}/{name}", lambda: client.get_or_none(*JOBSET, name, ns), up, timeout=180)
    if up.plan.kueue is not None:
        workloads = wait_for(f"the admitted Workload of {ns}/{name}", lambda: [w for w in client.list(*WORKLOAD, ns)
                             if any(r["name"] == name for r in w["metadata"].get("ownerReferences", [])) and _conditions(w).get("Admitted", {}).get("status") == "True"], up, timeout=120)
        for podset in workloads[0]["status"]["admission"]["podSetAssignments"]:
            for flavor_name in set(podset.get("flavors", {}).values()):
                flavor = client.get("kueue.x-k8s.io/v1beta2", "ResourceFlavor", flavor_name)
                pool = (flavor["spec"].get("nodeLabels") or {}).get("training-platform/pool")
                if pool is None:
                    continue  # the system-nodes flavor: the managed node groups
                itype = _instance_type(job)
                assert itype is None or _launchable(pools[pool], itype), f"{ns}/{name} ({itype}) admitted into flavor {flavor_name} whose NodePool cannot launch it"

    def pods_placed():
        pods = client.list("v1", "Pod", ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")
        return pods if pods and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for(f"the pods of {ns}/{name} bound to nodes", pods_placed, up, timeout=240)
    for pod in pods:
        node = client.get("v1", "Node", pod["spec"]["nodeName"])
        assert node_satisfies(node, pod) == [], f"{pod['metadata']['name']} on {node['metadata']['name']}"
        gpu = pod["spec"]["containers"][0].get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if gpu:  # GPU pods land on nodes Karpenter launched from a twin of the stack's NodePool
            pool = node["metadata"]["labels"].get("karpenter.sh/nodepool", "")
            assert pool.startswith(sim.TWIN_PREFIX), node["metadata"]["labels"]
    wait_for(f"{ns}/{name} Complete", lambda: _conditions(client.get(*TRAINJOB, name, ns)).get("Complete", {}).get("status") == "True", up, timeout=240)


def _instance_type(job: dict) -> str | None:
    """The instance type a TrainJob's node pods select (set by the platform's builders)."""
    text = str(job)
    from config import catalog

    return next((t for t in catalog.catalog() if f"'{t}'" in text), None)


def test_a_render_beside_a_running_cluster_keeps_it_and_validate_brings_its_own_api_server(clusters, capsys):
    """`make render` beside a running cluster keeps the cluster's state; `make validate` judges with
    a bare API server of its own (tools/cluster/bare.py), and a field the served schema does not
    know is its refusal."""
    import yaml

    from tools import render, validate
    from tools.cluster.up import PROJECT_DIR
    from tools.mock_runtime import run_program

    up = clusters.get("dev")
    stack_dir = up.dir.parent
    render.write(run_program(str(PROJECT_DIR), "dev"), str(stack_dir.parent))
    assert (up.dir / "state.json").is_file()  # the render kept the cluster's state
    manifests = stack_dir / "manifests"
    runtime = next(manifests.glob("clustertrainingruntime-torch-distributed-gpu-*.yaml"))
    obj = yaml.safe_load(runtime.read_text())
    obj["spec"]["template"]["spec"]["failurePolicyy"] = {"maxRestarts": 1}  # a typo the API server would prune
    runtime.write_text(yaml.safe_dump(obj))
    capsys.readouterr()
    assert validate.main([str(manifests)]) == 1
    out = capsys.readouterr().out
    assert "failurePolicyy" in out and "judged by the API server, 1 problems" in out
