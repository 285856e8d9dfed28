"""Kueue routes every job only into flavors whose NodePool can launch it.

Kueue v0.19.2 (``pkg/scheduler/flavorassigner/flavorassigner.go``, ``checkFlavorForPodSets`` and
``flavorSelector``) checks a pod set's nodeSelector and required node affinity only on the label
keys the candidate ResourceFlavor lists in ``nodeLabels``; keys the flavor does not list (such as
``node.kubernetes.io/instance-type``) never rule it out. A flavor may be picked when those labels
match and the cohort has quota of every resource the pod set requests in that flavor. For each
such flavor of a GPU pool, the NodePool carrying that pool label must allow the job's instance type
and zone, or the job is admitted and never scheduled (``waitForPodsReady`` then evicts and
requeues it). The e2e tests run the same jobs through the real Kueue.
"""

from __future__ import annotations

import pytest

from k8s.builders import trainer_api
from k8s.builders.gpu_objects import POOL_LABEL
from tests.conftest import dev_config, objects, run_config, stack_file
from tools.cluster.apply import _quantity
from trainctl import code
from trainctl import objects as trainctl_objects

TEAMS = {"vision": {"gpuQuota": 16, "principalArns": ["arn:aws:iam::123456789012:role/VisionTeam"]}, "nlp": {"gpuQuota": 8, "principalArns": ["arn:aws:iam::123456789012:role/NlpTeam"]}}


def _prod_with_teams() -> dict:
    cfg = stack_file("prod")["config"]
    cfg = {**cfg, "training-platform:tenants": TEAMS}
    efa = dict(cfg.get("training-platform:efa") or {})
    efa["instanceTypes"] = ["p5.48xlarge", "p5en.48xlarge"]  # two network layouts: two EFA pools
    cfg["training-platform:efa"] = efa
    return cfg


CONFIGS = {
    "dev-teams": (lambda: dev_config(gpuPool={"gpuLimit": 32}, tenants=TEAMS), "dev"),
    "prod-teams-two-efa-pools": (_prod_with_teams, "prod"),
}


def _matches(selector: dict, affinity_terms: list[dict] | None, labels: dict) -> bool:
    """Kueue's flavorSelector: only the flavor's label keys are checked."""
    for key, value in selector.items():
        if key in labels and labels[key] != value:
            return False
    if affinity_terms:
        kept = []
        for term in affinity_terms:
            exprs = [e for e in term.get("matchExpressions", []) if e["key"] in labels]
            if not exprs:
                return True  # a term with no checked key matches (terms are ORed)
            kept.append(exprs)
        ops = {"In": lambda v, vs: v in vs, "NotIn": lambda v, vs: v not in vs, "Exists": lambda v, _: v is not None, "DoesNotExist": lambda v, _: v is None}
        return any(all(ops[e["operator"]](labels.get(e["key"]), e.get("values", [])) for e in exprs) for exprs in kept)
    return True


def _launchable(node_pool: dict, instance_type: str, zone: str | None) -> bool:
    for req in node_pool["spec"]["template"]["spec"]["requirements"]:
        values = req.get("values", [])
        if req["key"] == "node.kubernetes.io/instance-type" and (instance_type in values) != (req["operator"] == "In"):
            return False
        if req["key"] == "topology.kubernetes.io/zone" and zone and (zone in values) != (req["operator"] == "In"):
            return False
    return True


def _cohort_quota(objs: list[dict], flavor: str) -> dict[str, float]:
    total: dict[str, float] = {}
    for cq in (o for o in objs if o["kind"] == "ClusterQueue"):
        for group in cq["spec"]["resourceGroups"]:
            for f in group["flavors"]:
                if f["name"] == flavor:
                    for r in f["resources"]:
                        total[r["name"]] = total.get(r["name"], 0) + (_quantity(r["nominalQuota"]) or 0)
    return total


def _pickable_flavors(objs: list[dict], pod: dict) -> list[dict]:
    selector = pod.get("nodeSelector") or {}
    terms = (((pod.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    requests: dict[str, float] = {}
    for c in pod.get("containers", []):
        for name, value in {**(c.get("resources") or {}).get("requests", {}), **(c.get("resources") or {}).get("limits", {})}.items():
            requests[name] = max(requests.get(name, 0), _quantity(value) or 0)
    out = []
    for flavor in (o for o in objs if o["kind"] == "ResourceFlavor"):
        labels = flavor["spec"].get("nodeLabels") or {}
        if not _matches(selector, terms, labels):
            continue
        quota = _cohort_quota(objs, flavor["metadata"]["name"])
        if all(quota.get(name, 0) > 0 for name, v in requests.items() if v > 0 and name in ("nvidia.com/gpu", "vpc.amazonaws.com/efa")):
            out.append(flavor)
    return out


def _check(objs: list[dict], pod: dict, what: str) -> None:
    selector = pod.get("nodeSelector") or {}
    itype, zone = selector.get("node.kubernetes.io/instance-type"), selector.get("topology.kubernetes.io/zone")
    pools = {p["spec"]["template"]["metadata"]["labels"][POOL_LABEL]: p for p in objs if p["kind"] == "NodePool"}
    flavors = _pickable_flavors(objs, pod)
    gpu_flavors = [f for f in flavors if POOL_LABEL in (f["spec"].get("nodeLabels") or {})]
    assert gpu_flavors, f"{what} ({itype}): no flavor may admit it"
    for flavor in gpu_flavors:
        pool = pools[flavor["spec"]["nodeLabels"][POOL_LABEL]]
        assert _launchable(pool, itype, zone), f"{what} ({itype}, zone {zone}) may be admitted into flavor {flavor['metadata']['name']}, whose NodePool cannot launch it"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_stack_job_lands_only_in_flavors_whose_pool_launches_it(name):
    make, stack = CONFIGS[name]
    objs = list(objects(run_config(make(), stack)).values())
    jobs = [o for o in objs if o["kind"] == "TrainJob"]
    assert jobs
    for job in jobs:
        _check(objs, trainer_api.read_pod_customization(job["spec"]) | _requests_of(job, objs), f"{name}: {job['metadata']['name']}")


def _requests_of(job: dict, objs: list[dict]) -> dict:
    """The trainer pod's containers (resources) from the runtime it runs on, merged with the job's."""
    runtime = next(o for o in objs if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["name"] == job["spec"]["runtimeRef"]["name"])
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if rj["name"] == trainer_api.TRAINER_JOB:
            containers = rj["template"]["spec"]["template"]["spec"]["containers"]
            resources = (job["spec"].get("trainer") or {}).get("resourcesPerNode") or containers[0].get("resources") or {}
            return {"containers": [{"name": "node", "resources": resources}]}
    return {}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_trainctl_job_shape_lands_only_in_flavors_whose_pool_launches_it(name, tmp_path):
    make, stack = CONFIGS[name]
    objs = list(objects(run_config(make(), stack)).values())
    (tmp_path / "train.py").write_text("print(1)\n")
    bundle = code.collect(tmp_path)
    gpu_pool = next(p for p in objs if p["kind"] == "NodePool" and p["spec"]["template"]["metadata"]["labels"][POOL_LABEL] == "gpu-pool")
    types = next(r["values"] for r in gpu_pool["spec"]["template"]["spec"]["requirements"] if r["key"] == "node.kubernetes.io/instance-type")
    for itype in types:
        for nodes in (1, 2):
            req = trainctl_objects.Request(namespace="vision", nodes=nodes, command=["python", "train.py"], instance_type=itype, name="shape")
            _, job = trainctl_objects.build(req, bundle)
            pod = trainer_api.read_pod_customization(job["spec"])
            res = (job["spec"].get("trainer") or {}).get("resourcesPerNode") or {}
            _check(objs, pod | {"containers": [{"name": "node", "resources": res}]}, f"{name}: trainctl --instance-type {itype} --nodes {nodes}")
