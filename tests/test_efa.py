"""EFA: the devices a job requests are exactly the devices its nodes expose.

How a node's ``vpc.amazonaws.com/efa`` capacity is computed is Karpenter's behaviour, modelled here
from karpenter-provider-aws v1.14.1 ``pkg/providers/instancetype/types.go`` (``efas``): with
``spec.networkInterfaces`` on the EC2NodeClass, the ``efa-only`` entries are counted; without
it, the type's ``MaximumEfaInterfaces``. ``compatibility.go`` in the same release refuses a type
when the node class lists more ``efa-only`` interfaces than that maximum, or a device index the
card does not have.
"""

from __future__ import annotations

import pytest

from config import catalog
from k8s.builders import gpu_objects as g
from tests.conftest import dev_config, objects, run_config, run_stack
from workloads.builders.trainjobs import EFA_ENV

# EC2 DescribeInstanceTypes NetworkInfo.EfaInfo.MaximumEfaInterfaces for every EFA type of the
# catalog, as published in karpenter-provider-aws v1.14.1
# website/content/en/docs/reference/instance-types.md (the `vpc.amazonaws.com/efa` resource,
# generated from the EC2 API), cross-checked with the EC2 User Guide's EFA pages (Nov 2026).
EFA_MAXIMUM = {
    "g5.8xlarge": 1, "g5.12xlarge": 1, "g5.16xlarge": 1, "g5.24xlarge": 1, "g5.48xlarge": 1,
    "g6.8xlarge": 1, "g6.12xlarge": 1, "g6.16xlarge": 1, "g6.24xlarge": 1, "g6.48xlarge": 1,
    "g6e.8xlarge": 1, "g6e.12xlarge": 1, "g6e.16xlarge": 1, "g6e.24xlarge": 2, "g6e.48xlarge": 4,
    "gr6.8xlarge": 1, "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.4xlarge": 1,
    "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16,
}  # fmt: skip


def karpenter_efa_capacity(node_class_spec: dict | None, instance_type: str) -> int:
    """What Karpenter advertises as vpc.amazonaws.com/efa for a node (the model above)."""
    nics = (node_class_spec or {}).get("networkInterfaces")
    if nics is not None:
        return sum(1 for n in nics if n["interfaceType"] == "efa-only")
    return EFA_MAXIMUM.get(instance_type, 0)


def karpenter_accepts(nics: list[dict], instance_type: str) -> bool:
    """compatibility.go: no more efa-only interfaces than the type's maximum."""
    return sum(1 for n in nics if n["interfaceType"] == "efa-only") <= EFA_MAXIMUM.get(instance_type, 0)


def test_catalog_efa_maxima_match_the_published_table():
    efa_types = {i.name: i.efa_interfaces for i in catalog.catalog().values() if i.efa}
    assert efa_types == EFA_MAXIMUM
    assert all(i.efa_interfaces == 0 for i in catalog.catalog().values() if not i.efa)


@pytest.mark.parametrize("instance_type", sorted(EFA_MAXIMUM))
def test_every_efa_type_node_class_exposes_its_maximum(instance_type):
    nics = g.efa_network_interfaces(instance_type)
    assert karpenter_efa_capacity({"networkInterfaces": nics}, instance_type) == EFA_MAXIMUM[instance_type]
    assert g.efa_devices_per_node(instance_type) == EFA_MAXIMUM[instance_type]
    assert karpenter_accepts(nics, instance_type)
    # the CRD's CEL rules: one primary ENA interface at card 0 device 0; unique (card, device)
    # pairs; at most one efa-only interface per card
    assert {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"} in nics
    pairs = [(n["networkCardIndex"], n["deviceIndex"]) for n in nics]
    assert len(pairs) == len(set(pairs))
    efa_cards = [n["networkCardIndex"] for n in nics if n["interfaceType"] == "efa-only"]
    assert len(efa_cards) == len(set(efa_cards))
    # AWS's recommended layout: EFA-only beside the primary on card 0, device 0 elsewhere
    assert {"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"} in nics
    assert all(n["deviceIndex"] == 0 for n in nics if n["networkCardIndex"] > 0)
    assert max(n["networkCardIndex"] for n in nics) < catalog.lookup(instance_type).network_cards


def test_non_efa_type_has_no_layout():
    assert g.efa_devices_per_node("g5.xlarge") == 0
    with pytest.raises(ValueError):
        g.efa_network_interfaces("g5.xlarge")


def _pool_for(objs: dict, instance_type: str, efa: bool) -> dict:
    for o in objs.values():
        if o["kind"] != "NodePool":
            continue
        labels = o["spec"]["template"]["metadata"]["labels"]
        reqs = {r["key"]: r["values"] for r in o["spec"]["template"]["spec"]["requirements"]}
        if instance_type in reqs["node.kubernetes.io/instance-type"] and (labels.get(g.EFA_LABEL) == "true") == efa:
            return o
    raise AssertionError(f"no NodePool for {instance_type} (efa={efa})")


def _trainer_env(job: dict) -> list[dict]:
    return job["spec"]["trainer"].get("env", [])


def _check_jobs_fit_their_nodes(run) -> int:
    objs = objects(run)
    classes = {o["metadata"]["name"]: o["spec"] for o in objs.values() if o["kind"] == "EC2NodeClass"}
    checked = 0
    for job in (o for o in objs.values() if o["kind"] == "TrainJob"):
        trainer = job["spec"]["trainer"]
        requested = trainer["resourcesPerNode"]["limits"].get("vpc.amazonaws.com/efa", 0)
        itype = next(v for k, v in _node_selector(job).items() if k == "node.kubernetes.io/instance-type")
        pool = _pool_for(objs, itype, efa=bool(requested))
        ref = pool["spec"]["template"]["spec"]["nodeClassRef"]
        node_class = classes.get(ref["name"]) if ref["kind"] == "EC2NodeClass" else None  # Auto Mode: no interfaces
        exposed = karpenter_efa_capacity(node_class, itype) if requested else 0
        info = catalog.lookup(itype)
        if trainer["numProcPerNode"] == info.gpus:  # a whole node: every device it has
            assert requested == exposed, (job["metadata"]["name"], itype, requested, exposed)
        assert requested <= exposed or not requested
        fi = {e["name"] for e in _trainer_env(job)} & {e["name"] for e in EFA_ENV}
        assert bool(fi) == bool(requested), f"{job['metadata']['name']}: EFA env without EFA devices (or the reverse)"
        checked += 1
    return checked


def _node_selector(job: dict) -> dict:
    from k8s.builders import trainer_api

    return trainer_api.read_pod_customization(job["spec"])["nodeSelector"]


def test_prod_efa_job_requests_exactly_what_its_node_class_provides():
    run = run_stack("prod")
    assert _check_jobs_fit_their_nodes(run) >= 1
    job = next(o for o in objects(run).values() if o["kind"] == "TrainJob")
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == 32


@pytest.mark.parametrize(
    "instance_type, gpus_per_node, expected",
    [("p4d.24xlarge", None, 4), ("g5.48xlarge", None, 1), ("p5en.48xlarge", None, 16), ("p5.48xlarge", 4, 16), ("g6e.48xlarge", None, 4)],
)
def test_efa_jobs_fit_nodes_for_mixed_layouts(instance_type, gpus_per_node, expected):
    efa_types = ["p4d.24xlarge", "g5.48xlarge", "p5en.48xlarge", "p5.48xlarge", "g6e.48xlarge"]
    fsdp = {"instanceType": instance_type, "numNodes": 2, "availabilityZone": "us-west-2a"}
    if gpus_per_node:
        fsdp["gpusPerNode"] = gpus_per_node
    for mode in ("karpenter", "auto"):
        run = run_config(dev_config(gpuPool={"mode": mode, "gpuLimit": 64}, efa={"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": efa_types}, trainjobs={"fsdp": fsdp}))
        assert _check_jobs_fit_their_nodes(run) == 4  # every TrainJob of the dev stack
        job = next(o for o in objects(run).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
        assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == expected


def test_efa_capable_type_outside_the_efa_pool_gets_no_efa_env():
    # g5.12xlarge supports EFA but only p5 is in the EFA pool: the job runs on gpu-pool, no EFA
    run = run_config(dev_config(efa={"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}, gpuPool={"gpuLimit": 64}))
    assert _check_jobs_fit_their_nodes(run) == 4  # every TrainJob of the dev stack
    for job in (o for o in objects(run).values() if o["kind"] == "TrainJob"):
        assert "vpc.amazonaws.com/efa" not in job["spec"]["trainer"]["resourcesPerNode"]["limits"]
        assert all(e["name"] != "FI_PROVIDER" for e in _trainer_env(job))
        assert g.EFA_LABEL not in _node_selector(job)


def test_efa_node_classes_group_types_by_layout():
    from config.settings import EfaSettings

    layouts = g.efa_layouts(EfaSettings(enabled=True, availability_zone="us-west-2a", instance_types=["p5.48xlarge", "p5e.48xlarge", "p4d.24xlarge", "g5.48xlarge"]))
    assert sorted(map(sorted, layouts.values())) == [["g5.48xlarge"], ["p4d.24xlarge"], ["p5.48xlarge", "p5e.48xlarge"]]
    for types in layouts.values():
        assert len({g.efa_devices_per_node(t) for t in types}) == 1


def test_efa_job_without_a_zone_is_pinned_to_the_efa_zone():
    run = run_config(dev_config(efa={"enabled": True, "availabilityZone": "us-west-2b", "instanceTypes": ["g5.12xlarge"]}, gpuPool={"gpuLimit": 64}))
    job = next(o for o in objects(run).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "fsdp-t5")
    assert _node_selector(job)["topology.kubernetes.io/zone"] == "us-west-2b"
    ddp = next(o for o in objects(run).values() if o["kind"] == "TrainJob" and o["metadata"]["name"] == "ddp-mnist")
    assert "topology.kubernetes.io/zone" not in _node_selector(ddp)  # g5.xlarge: no EFA, no pin
