"""`pulumi destroy` deletes in reverse dependency order: prove on plan.json that everything that
must go first depends (transitively) on what must go last."""

import re

import pytest

from tests.conftest import dev_config, run_config, run_stack
from workloads.builders.trainjobs import WORKLOADS


class Graph:
    def __init__(self, plan: dict):
        self.resources = plan["resources"]
        self.edges: dict[str, set[str]] = {}
        for r in self.resources:
            deps = set(r["dependsOn"])
            for urns in r.get("propertyDependencies", {}).values():
                deps |= set(urns)
            if r.get("provider"):
                deps.add(r["provider"].rsplit("::", 1)[0])
            self.edges[r["urn"]] = deps

    def find(self, typ_suffix: str, name: str | None = None) -> list[str]:
        found = [r["urn"] for r in self.resources if r["type"].endswith(typ_suffix) and (name is None or r["name"] == name)]
        assert found, f"no {typ_suffix} {name or ''} in plan"
        return found

    def reaches(self, start: str, target: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            u = todo.pop()
            if u == target:
                return True
            if u not in seen:
                seen.add(u)
                todo.extend(self.edges.get(u, ()))
        return False

    def all_reach(self, starts, targets):
        for s in starts:
            for t in targets:
                assert self.reaches(s, t), f"{s.split('::')[-1]} does not depend on {t.split('::')[-1]}: destroy could delete it first"


@pytest.fixture(scope="module")
def graph():
    return Graph(run_stack("dev").plan())


def test_trainjobs_go_before_runtimes_code_storage_and_node_pools(graph):
    jobs = graph.find(":TrainJob")
    assert len(jobs) == len(WORKLOADS)  # every job of the dev stack, each on the runtime the workload registry names
    for w in WORKLOADS.values():
        job = [u for u in jobs if u.endswith(f"::trainjob-training-{w.name}")]
        runtime = [u for u in graph.find(":ClusterTrainingRuntime") if re.search(rf"::clustertrainingruntime-{w.runtime}-[0-9a-f]{{8}}$", u)]
        assert len(job) == 1 and len(runtime) == 1, (w.name, jobs)
        graph.all_reach(job, runtime)
    graph.all_reach(jobs, graph.find(":NodePool") + graph.find(":EC2NodeClass"))
    ops = "platform-ops"  # the smoke check's and the TrainJob cleanup's objects (k8s/builders/operations.py), unrelated to the jobs
    graph.all_reach(jobs, graph.find(":PersistentVolumeClaim") + [u for u in graph.find(":ConfigMap") + graph.find(":Namespace") if ops not in u])


def test_runtimes_outlive_trainjobs_and_go_before_the_trainer(graph):
    graph.all_reach(graph.find(":ClusterTrainingRuntime"), graph.find("helm.sh/v3:Release", "kubeflow-trainer"))


def test_karpenter_outlives_its_nodes(graph):
    karpenter = graph.find("helm.sh/v3:Release", "karpenter")
    graph.all_reach(graph.find(":NodePool") + graph.find(":EC2NodeClass"), karpenter)
    # Karpenter keeps its identity, node access and interruption queue while it drains nodes
    graph.all_reach(karpenter, graph.find(":PodIdentityAssociation", "gpu-karpenter") + graph.find("eks/accessEntry:AccessEntry") + graph.find("sqs/queue:Queue"))


def test_everything_in_the_cluster_goes_before_nodes_cluster_and_network(graph):
    in_cluster = [r["urn"] for r in graph.resources if r["type"].startswith("kubernetes:")]
    base = graph.find("eks:index:ManagedNodeGroup") + graph.find("eks:index:Cluster") + graph.find("aws:ec2/subnet:Subnet") + graph.find("aws:ec2/vpc:Vpc")
    graph.all_reach(in_cluster, base)


def test_storage_and_efa_resources_outlive_their_users():
    g = Graph(run_config(dev_config(efa={"enabled": True, "availabilityZone": "us-west-2a"})).plan())
    graph_pv = g.find(":PersistentVolume")
    g.all_reach(graph_pv, g.find("fsx/lustreFileSystem:LustreFileSystem") + g.find("eks/addon:Addon", "checkpoints-csi"))
    efa_class = g.find(":EC2NodeClass", "ec2nodeclass-gpu-efa")
    g.all_reach(efa_class, g.find("ec2/placementGroup:PlacementGroup") + g.find("ec2/securityGroup:SecurityGroup", "gpu-efa"))
