"""Pure builders for Kueue (chart ``oci://registry.k8s.io/kueue/charts/kueue`` 0.19.2): the Helm
values, a ResourceFlavor per GPU pool, a ClusterQueue per team (and one for the stack's own
jobs), all in one cohort, and the LocalQueue of a namespace.

Facts from kubernetes-sigs/kueue at tag v0.19.2 this module relies on (tests/test_tenants.py
checks them against the CRDs in ``../shared/schemas/kueue/v0.19.2``):

* API ``kueue.x-k8s.io/v1beta2`` (served and stored; v1beta1 is served too). In v1beta2 a
  ClusterQueue names its cohort with ``spec.cohortName`` (v1beta1: ``spec.cohort``).
* ``resourceGroups``: every resource a pod requests must be covered by its ClusterQueue (the
  default ``quotaCheckStrategy: BlockUndeclared``), each resource in one group only, and every
  flavor of a group lists the group's ``coveredResources`` in the same order (CRD CEL rule
  "flavors must have the same number of resources as the coveredResources"). So ``cpu``,
  ``memory``, ``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` form one group.
* The TrainJob integration is the framework ``trainer.kubeflow.org/trainjob``
  (``pkg/controller/jobs/trainjob/trainjob_controller.go``) in
  ``managerConfig.controllerManagerConfigYaml``, a string that replaces the chart's whole
  configuration (``charts/kueue/templates/manager/manager-config.yaml``), so it is written whole here.
* All-or-nothing: Kueue admits a workload whole (quota for every pod set at once), and
  ``waitForPodsReady`` evicts and requeues an admitted job whose pods are not all ready within the
  timeout (``site/content/en/docs/tasks/manage/setup_wait_for_pods_ready.md``), so a job that got
  only some of its nodes does not hold GPUs.
* The chart templates its CRDs (``charts/kueue/templates/crd/``, upgraded with the release), and
  the manager's readiness probe passes only once its webhook certificates are in place and the
  webhook server listens (``cmd/kueue/main.go`` setupProbeEndpoints): with the Helm release
  awaited, objects of Kueue's kinds and labelled TrainJobs created after it are admitted by a
  serving webhook, in the same ``pulumi up``.
* Topology-aware scheduling (TAS) counts only Ready nodes' allocatable capacity
  (``site/content/en/docs/concepts/topology_aware_scheduling.md``, "Capacity calculation") and
  reaches an autoscaler only through the ProvisioningRequest admission check (Cluster Autoscaler).
  The GPU pools here are Karpenter NodePools that start empty and launch nodes for pending pods; a
  TAS flavor would hold every job suspended (no pods, so Karpenter launches no nodes, so no
  capacity). The EFA pool's placement is enforced where it is created instead: one AZ and one
  cluster placement group (``k8s/builders/gpu_objects.py``). So no Topology and no ``topologyName``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

import versions
from config import catalog
from config.labels import NODE_ROLE_LABEL
from config.namespaces import KUEUE_NAMESPACE  # noqa: F401  (part of this module's interface)
from config.settings import Settings, TenantSettings
from k8s.builders.gpu_objects import EFA_LABEL, GPU_POOL, POOL_LABEL, efa_devices_per_node, efa_layouts
from k8s.builders.runtimes import INITIALIZER_RESOURCES
from k8s.builders.tenants import LOCAL_QUEUE, TEAM_LABEL

API_VERSION = "kueue.x-k8s.io/v1beta2"
COHORT = "training-platform"
TRAINING_QUEUE = "platform-jobs"
"""The ClusterQueue of the stack's own jobs (trainjobs.*), in the same cohort as the teams'."""
TRAINJOB_FRAMEWORK = "trainer.kubeflow.org/trainjob"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
COVERED_RESOURCES = ["cpu", "memory", GPU, EFA]
SYSTEM_FLAVOR = "system-nodes"
"""CPU-only pod sets (the Trainer's dataset and model initializers, k8s/builders/runtimes.py) run on the
system node groups. Kueue gives every pod set of an admitted job a flavor and adds the flavor's
``nodeLabels`` to its pods (v0.19.2 ``pkg/podset``), trying a queue's flavors in order; with only GPU
pool flavors an initializer pod would be sent to a tainted GPU node it does not tolerate and the
job would never start. This flavor comes first with CPU and memory quota and no GPUs, so GPU pod
sets pass it by and CPU-only ones take it."""
SYSTEM_JOBS_AT_ONCE = 2
"""How many jobs' initializers a queue may run at once on the system nodes."""


@dataclass(frozen=True)
class Pool:
    """A GPU NodePool as Kueue sees it: a ResourceFlavor with the pool's node label."""

    name: str
    instance_types: tuple[str, ...]
    gpu_limit: int
    efa: bool

    def per_gpu(self) -> tuple[float, float, float]:
        """(vCPUs, GiB of memory, EFA devices) per GPU: the largest ratio among the pool's types."""
        infos = [catalog.lookup(t) for t in self.instance_types]
        cpu = max(i.vcpu / i.gpus for i in infos)
        mem = max(i.memory_gib / i.gpus for i in infos)
        efa = max(efa_devices_per_node(t) / catalog.lookup(t).gpus for t in self.instance_types) if self.efa else 0.0
        return cpu, mem, efa


def pools(settings: Settings) -> list[Pool]:
    """The stack's GPU pools, in the order Kueue tries them: the gpu-pool first, then the EFA pools
    (same names, types and limits as the NodePools in ``k8s/builders/gpu_objects.py``)."""
    out = [Pool(GPU_POOL, tuple(i.name for i in settings.gpu_pool.allowed_types()), settings.gpu_pool.gpu_limit, efa=False)]
    if settings.efa.enabled:
        for name, types in efa_layouts(settings.efa).items():
            gpus = sum(catalog.lookup(t).gpus for t in types)
            out.append(Pool(name, tuple(types), max(settings.gpu_pool.gpu_limit, gpus), efa=True))
    return out


def resource_flavor(pool: Pool) -> dict:
    """Kueue adds the flavor's ``nodeLabels`` to an admitted job's pods as a node selector: the
    label every node of the pool carries (its NodePool template), so Karpenter launches the pods
    in that pool. EFA pools also carry the EFA label jobs select."""
    labels = {POOL_LABEL: pool.name}
    if pool.efa:
        labels[EFA_LABEL] = "true"
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": pool.name}, "spec": {"nodeLabels": labels}}


def system_resource_flavor() -> dict:
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": SYSTEM_FLAVOR}, "spec": {"nodeLabels": {NODE_ROLE_LABEL: "system"}}}


def _system_quantities() -> dict[str, Any]:
    """Room for ``SYSTEM_JOBS_AT_ONCE`` jobs' two initializers (their requests in k8s/builders/runtimes.py)."""
    req = INITIALIZER_RESOURCES["requests"]
    pods = 2 * SYSTEM_JOBS_AT_ONCE
    memory_gi = int(req["memory"].removesuffix("Gi"))
    return {"cpu": str(int(req["cpu"]) * pods), "memory": f"{memory_gi * pods}Gi", GPU: 0, EFA: 0}


def _quantities(pool: Pool, gpus: int, cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
    """Nominal quota of every covered resource for ``gpus`` GPUs of a pool: CPU and memory as
    given, else what those GPUs bring on the pool's nodes; EFA devices only on EFA pools."""
    cpu_per, mem_per, efa_per = pool.per_gpu()
    return {
        "cpu": cpu if cpu is not None else str(math.ceil(gpus * cpu_per)),
        "memory": memory if memory is not None else f"{math.ceil(gpus * mem_per)}Gi",
        GPU: gpus,
        EFA: math.ceil(gpus * efa_per),
    }


def cluster_queue(name: str, *, namespace: str, quotas: dict[str, dict[str, Any]], team: str | None = None) -> dict:
    """A ClusterQueue in the cohort, usable only from ``namespace``. ``quotas``: flavor -> resource ->
    nominal quota (every covered resource, in order). Borrowing: any idle quota of the cohort
    (no borrowing limit); reclaim: a queue whose nominal quota is lent out preempts the borrowers
    (``reclaimWithinCohort: Any``), so a team always gets its guarantee back; within a queue, a
    higher-priority job may preempt a lower one."""
    meta: dict[str, Any] = {"name": name}
    if team is not None:
        meta["labels"] = {TEAM_LABEL: team}
    flavors = [{"name": flavor, "resources": [{"name": r, "nominalQuota": res[r]} for r in COVERED_RESOURCES]} for flavor, res in quotas.items()]
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": meta,
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": list(COVERED_RESOURCES), "flavors": flavors}],
            # borrow in the first pool that fits rather than preempt there; try the next pool first
            "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
            "preemption": {"reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": PRIORITIES["low"]}, "withinClusterQueue": "LowerPriority"},
        },
    }


# Kueue WorkloadPriorityClasses (kueue v0.19.2 apis/kueue/v1beta2 WorkloadPriorityClass: value,
# description), named by the label kueue.x-k8s.io/priority-class on a job. Within a ClusterQueue a
# higher one preempts lower ones (withinClusterQueue: LowerPriority); in the cohort a job that
# borrows may preempt only low jobs that borrow (borrowWithinCohort LowerPriority, at most low).
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
PRIORITIES = {"low": 100, "normal": 1000, "high": 10000}


def priority_classes() -> list[dict]:
    what = {"low": "preemptible: experiments and sweeps", "normal": "the default", "high": "deadlines: may preempt lower ones"}
    return [{"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value, "description": what[name]} for name, value in PRIORITIES.items()]


def team_queue_name(team: str) -> str:
    return f"team-{team}"


def team_cluster_queue(team: str, tenant: TenantSettings, *, namespace: str, settings: Settings) -> dict:
    gpus = tenant.gpu_quota or 0
    quotas = {SYSTEM_FLAVOR: _system_quantities(), **{p.name: _quantities(p, gpus, tenant.cpu_quota, tenant.memory_quota) for p in pools(settings)}}
    return cluster_queue(team_queue_name(team), namespace=namespace, quotas=quotas, team=team)


def training_cluster_queue(settings: Settings) -> dict:
    """The stack's own jobs: what the teams' quotas leave of each pool (settings refuse quotas
    above ``gpuPool.gpuLimit``), borrowing the rest when the teams are idle."""
    teams = sum(t.gpu_quota or 0 for t in settings.tenants.teams().values())
    quotas = {SYSTEM_FLAVOR: _system_quantities(), **{p.name: _quantities(p, max(0, p.gpu_limit - teams)) for p in pools(settings)}}
    return cluster_queue(TRAINING_QUEUE, namespace=settings.trainjobs.namespace, quotas=quotas)


def local_queue(namespace: str, cluster_queue_name: str, team: str | None = None) -> dict:
    meta: dict[str, Any] = {"name": LOCAL_QUEUE, "namespace": namespace}
    if team is not None:
        meta["labels"] = {TEAM_LABEL: team}
    return {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": meta, "spec": {"clusterQueue": cluster_queue_name}}


def gpu_ceiling(settings: Settings) -> int:
    """The most GPUs Kueue can admit to one queue: every GPU of the cohort's nominal quotas
    (no borrowing limit), over all pools."""
    return sum(p.gpu_limit for p in pools(settings))


def manager_config(settings: Settings) -> dict[str, Any]:
    """Kueue's whole Configuration (``config.kueue.x-k8s.io/v1beta2``): the chart's defaults for
    probes, metrics, webhook and leader election (charts/kueue/values.yaml at v0.19.2), only the
    TrainJob integration, and all-or-nothing admission."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "clientConnection": {"qps": 300, "burst": 500},
        "integrations": {"frameworks": [TRAINJOB_FRAMEWORK]},
        "waitForPodsReady": {
            "timeout": settings.pods_ready_timeout(),
            "blockAdmission": False,
            # requeued behind the jobs that waited longer, with exponential backoff from 60 s
            # and deactivated after requeueLimit evictions (kueue v0.19.2 apis/config/v1beta2/defaults.go
            # leaves backoffLimitCount unset: requeued forever), with reason RequeuingLimitExceeded
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600, "backoffLimitCount": settings.kueue.requeue_limit},
        },
    }


def chart_values(settings: Settings) -> dict[str, Any]:
    """The release's values: the controller image pinned (the chart's own default is a staging
    image when not packaged for release: charts/kueue/values.yaml) and its configuration. Its pod
    lands on the system node groups: GPU nodes are tainted."""
    return {
        "controllerManager": {
            "manager": {"image": {"repository": versions.KUEUE_IMAGE_REPOSITORY, "tag": f"v{versions.KUEUE_VERSION}", "pullPolicy": "IfNotPresent"}},
        },
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(settings), sort_keys=False)},
    }
