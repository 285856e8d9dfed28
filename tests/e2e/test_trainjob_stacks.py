"""A TrainJob stack (workloads/) on the local control plane next to its platform: dev applied first,
then the ddp run applied as its own `pulumi up` would; that apply creates the run's ConfigMap and
TrainJob and nothing else, and the run's TrainJob runs (JobSet, pods on GPU nodes, Complete)."""

from __future__ import annotations

from tests.e2e.conftest import wait_for
from tools.cluster.apply import label
from tools.cluster.run_up import up_run

TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")


def test_a_run_stack_creates_only_its_run_and_it_runs(clusters):
    platform = clusters.get("dev")
    client = platform.client()
    before = {label(o) for wave in platform.plan.waves for o in wave}
    applied = up_run("ddp", platform_up=platform)
    assert applied.outcome.problems == []
    kinds = sorted(o["kind"] for o in applied.objects)
    assert kinds == ["ConfigMap", "TrainJob"]
    # the run's apply created exactly its two objects, none of the platform's
    assert sorted(applied.created) == sorted(label(o) for o in applied.objects)
    assert not set(applied.created) & before
    job = next(o for o in applied.objects if o["kind"] == "TrainJob")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert name == "ddp-mnist-ddp" and ns == "training"
    wait_for(f"the JobSet of {ns}/{name}", lambda: client.get_or_none(*JOBSET, name, ns), platform, timeout=180)

    def pods_placed():
        pods = client.list("v1", "Pod", ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")
        return pods if pods and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for(f"the pods of {ns}/{name} on nodes", pods_placed, platform, timeout=240)
    assert len(pods) == job["spec"]["trainer"]["numNodes"]
    for pod in pods:  # mounted: the run's own code ConfigMap and the platform's checkpoint claim
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["training-code"]["configMap"]["name"].startswith("ddp-mnist-ddp-code-")
        assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "checkpoints"

    def complete():
        conditions = {c["type"]: c["status"] for c in (client.get(*TRAINJOB, name, ns).get("status") or {}).get("conditions") or []}
        return conditions.get("Complete") == "True"

    wait_for(f"{ns}/{name} Complete", complete, platform, timeout=240)
    # the platform's own DDP job is untouched beside the run
    assert client.get(*TRAINJOB, "ddp-mnist", ns)["spec"]["trainer"]["numNodes"] == 2
