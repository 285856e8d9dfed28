"""Pure builders for a team's (tenant's) namespace: Namespace, ResourceQuota, LimitRange,
NetworkPolicy, Role and RoleBinding, and the team's checkpoint volume; plus the tenant-facing
constants every tool that submits into a team namespace shares (``trainctl``, the stack's jobs).

What a team gets, and why it is shaped so:

* **Isolation by namespace**: the Namespace carries :data:`TEAM_LABEL`; the NetworkPolicy admits
  ingress to the team's pods only from pods of the same namespace (every port: torchrun's
  rendezvous on ``PET_MASTER_PORT`` 29500 through the JobSet's headless Service, and NCCL/Gloo's
  own ephemeral ports between ranks), so other teams' pods cannot reach them. Egress
  (:func:`egress_policy`) reaches the namespace's own pods, cluster DNS and the public internet
  (dataset and model downloads, pip), not other namespaces, the nodes or the instance metadata
  service; a team with an AWS identity (``tenants.<team>.s3``) also reaches the Pod Identity agent.
  Enforced by the VPC CNI network-policy agent, which the cluster turns on when teams exist
  (``infra/cluster.py``).
* **Least privilege**: the Role lets the team create and delete TrainJobs and ConfigMaps (their
  code), read pods, pod logs, events, JobSets, Jobs and Kueue's Workloads and queue, and exec into
  its pods, in its namespace, and nothing else: Secrets write-only (for its jobs' secretEnv, never read back), no
  Pods of its own (privileged or not), no quota or policy edits. Bound to a Kubernetes group that
  the team's EKS access entries carry.
* **Quota**: the ResourceQuota caps GPUs (and CPU/memory when set); the LimitRange gives a
  container without requests/limits a default, so nothing in the namespace is unbounded.
"""

from __future__ import annotations

from typing import Any

from config import vpc_endpoints
from config.namespaces import (
    STORAGE_NAMESPACE,  # noqa: F401  (part of this module's interface)
    TRAINER_NAMESPACE,
)
from config.settings import DNS_LABEL_RE, TenantSettings
from k8s.builders import trainer_api

TEAM_LABEL = "training-platform/team"
"""Label on a team's namespace (and its other objects): the team name."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""Label that puts a TrainJob in a Kueue LocalQueue (kubernetes-sigs/kueue v0.19.2
``pkg/controller/constants/constants.go`` QueueLabel)."""
LOCAL_QUEUE = "default"
"""The LocalQueue in every Kueue-managed namespace. Kueue's TrainJob webhook also puts a job
without a queue label into the namespace's LocalQueue named ``default`` (kueue v0.19.2
``pkg/controller/jobframework/defaults.go``: ``setDefaultLocalQueue``), so an unlabelled job is
queued too."""
JOB_LABEL = "training-platform/job"
"""Label on every TrainJob the platform or trainctl creates: its job kind (the cleanup keeps
the platform's own kinds in the platform's namespace)."""
TTL_ANNOTATION = "training-platform/ttl-seconds-after-finished"
"""Annotation of a TrainJob that asks to be deleted this many seconds after it finishes (``trainctl
submit --ttl``, the portal's ``ttl_seconds_after_finished``), instead of the stack's
``trainjobs.finishedJobRetention`` and never later than ``trainjobs.finishedJobRetentionMax``
(k8s/pods/trainjob_cleanup.py). Its checkpoints stay."""
CODE_PREFIX = "training-code"
"""Name prefix of the code ConfigMaps a TrainJob mounts (``<prefix>-<hash>``): the only
ConfigMaps a team's admission policy lets a member create."""
TEAM_SERVICE_ACCOUNT = "team-jobs"
"""The service account a team's jobs run as, in every team namespace (trainctl and the portal set it
on the trainer pods; the admission policy allows it or ``default``). It has no Kubernetes
permissions; with ``tenants.<team>.s3`` set, EKS Pod Identity associates the team's IAM role with it
(``infra/team_identity.py``, docs/teams-aws-access.md)."""
CHECKPOINT_CLAIM = "checkpoints"
"""The RWX PersistentVolumeClaim a TrainJob mounts for checkpoints, in the training namespace and
in every team namespace (each team's claim is bound to the team's own directory)."""
TENANT_DIR = "tenants"
"""Directory of the checkpoint file system that holds one sub-directory per team."""
POD_SECURITY_LABELS = {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted"}
"""The platform's own namespaces that run root Jobs with a capability (the teams' directories)."""
TEAM_POD_SECURITY_LABELS = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}
"""Team namespaces: Pod Security ``restricted`` (``baseline`` still allows ``nfs`` volumes and root);
the runtimes' trainer pods run as the image's non-root user with no capabilities."""


# The verbs and resources a team's principals get in their namespace (tests assert exactly these).
TEAM_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["create", "delete", "get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "delete", "get", "list", "watch"]},
    # Secrets for its jobs' secretEnv (trainctl secret set, docs/env-and-secrets.md), write-only: no get, list or watch,
    # and no patch either: a PATCH answers with the whole patched object, data included (k8s.io/apiserver v0.34
    # pkg/endpoints/handlers/patch.go), so an empty patch would read any Secret. An update (PUT) needs only "update"
    # (pkg/endpoints/request/requestinfo.go) and answers with what the caller sent; a plain delete answers with a Status
    # (the Secrets' store returns no deleted object: kubernetes v1.34 pkg/registry/core/secret/storage/storage.go), but
    # one that leaves a finalizer pending answers with the Secret. Which Secrets and which deletes:
    # k8s/builders/admission.py secret_policy (no service-account token Secrets, no finalizers, plain deletes only).
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "update", "delete"]},
    {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # `kubectl exec` into the team's own pods (they run the team's code already, under Pod Security restricted). kubectl's
    # WebSocket exec is a GET ("get"), its SPDY fallback a POST ("create"); from Kubernetes 1.35 a GET upgrade is also
    # authorized for "create" (feature gate AuthorizePodWebsocketUpgradeCreatePermission, beta on: kubernetes v1.36.0
    # pkg/features/kube_features.go, pkg/registry/core/pod/rest/subresources.go ExecREST.Connect), so both verbs
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    # read-only: the objects between a TrainJob and its pods (the Trainer's JobSet, JobSet's batch Jobs), for debugging
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
    # the team's own caps (the runbook's "kubectl describe resourcequotas -n <ns>"), read-only
    {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "list", "watch"]},
    # the runtimes a job can run on (trainctl's runtime lookup, the Kubeflow SDK's get_job/list_runtimes)
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainingruntimes"], "verbs": ["get", "list", "watch"]},
    # the team's queue as Kueue sees it (trainctl status and usage, the portal's queue position and GPU use): its Workloads
    # and LocalQueue, and the LocalQueue's pending list through Kueue's visibility API (served in v1beta1 and v1beta2 at
    # kueue v0.19.2: pkg/visibility/server.go, pkg/visibility/storage/storage.go "localqueues/pendingworkloads"). The rule is
    # that of Kueue's own ClusterRole (kueue v0.19.2 config/components/rbac/pending_workloads_lq_viewer_role.yaml, in the
    # chart as <release>-pending-workloads-lq-viewer-role), written here rather than bound: the chart's aggregated
    # <release>-batch-user-role would also grant creating and patching JobSets, batch Jobs and TrainJobs directly
    # (config/components/rbac/*_editor_role.yaml), past the TrainJob admission policy.
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["visibility.kueue.x-k8s.io"], "resources": ["localqueues/pendingworkloads"], "verbs": ["get", "list", "watch"]},
]

RUNTIME_READER = "training-platform:runtime-reader"
"""ClusterRole bound to every team's group: read the ClusterTrainingRuntimes (cluster-scoped, so a
namespaced Role cannot grant it). Runtimes hold images, commands and scheduling, no secrets; a
team needs them to submit (the current content-hashed name) and the SDK to read a job's steps."""
RUNTIME_READER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["trainer.kubeflow.org"], "resources": ["clustertrainingruntimes"], "verbs": ["get", "list", "watch"]},
]

# Defaults for a container that sets no requests or limits. A memory limit bounds it (memory is not
# compressible: an unbounded container can take the node's); CPU gets a request but no limit (a
# CPU limit throttles training, and a default limit would refuse any container requesting more).
DEFAULT_REQUESTS = {"cpu": "500m", "memory": "1Gi"}
DEFAULT_LIMITS = {"memory": "8Gi"}


def team_group(team: str) -> str:
    """The Kubernetes group of a team's principals (EKS refuses group names starting ``system:``)."""
    return f"training-platform:team:{team}"


def team_role(team: str) -> str:
    return f"team-{team}"


def _meta(name: str, ns: str | None, team: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {TEAM_LABEL: team}}
    if ns is not None:
        meta["namespace"] = ns
    return meta


def namespace(ns: str, team: str) -> dict:
    if not DNS_LABEL_RE.fullmatch(ns):
        raise ValueError(f"namespace {ns!r} is not a DNS label")
    meta = _meta(ns, None, team)
    meta["labels"].update(TEAM_POD_SECURITY_LABELS)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def resource_quota(ns: str, team: str, tenant: TenantSettings, *, gpu_cap: int, kueue: bool = False, storage_gib: int | None = None) -> dict:
    """The namespace's hard caps. ``gpu_cap``: without Kueue the team's quota; with Kueue the most
    Kueue can admit to the team (its quota plus what it may borrow), so the quota never refuses
    the pods of a job Kueue admitted (half-created jobs) and still caps anything created outside Kueue.
    With Kueue the team's CPU and memory quotas are Kueue's (nominal in every flavor, borrowable),
    so they are not repeated here: a namespace cap of the same figure would refuse pods of admitted jobs.
    ``storage_gib``: the size of the team's checkpoint claim, the only claim the namespace may hold."""
    hard: dict[str, str] = {"requests.nvidia.com/gpu": str(gpu_cap)}  # extended resources: requests only
    if storage_gib is not None:
        # storage: the team's one checkpoint claim (teams cannot create claims; this caps it anyway)
        hard["persistentvolumeclaims"] = "1"
        hard["requests.storage"] = f"{storage_gib}Gi"
    if tenant.cpu_quota and not kueue:
        hard["requests.cpu"] = tenant.cpu_quota
    if tenant.memory_quota and not kueue:
        hard["requests.memory"] = tenant.memory_quota
        hard["limits.memory"] = tenant.memory_quota
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta("team-quota", ns, team), "spec": {"hard": hard}}


def limit_range(ns: str, team: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _meta("team-defaults", ns, team),
        "spec": {"limits": [{"type": "Container", "defaultRequest": dict(DEFAULT_REQUESTS), "default": dict(DEFAULT_LIMITS)}]},
    }


def network_policy(ns: str, team: str) -> dict:
    """The team's ingress fence (see :func:`ingress_policy`)."""
    return ingress_policy(ns, {TEAM_LABEL: team})


# Egress a training pod has no business with: the private ranges (other namespaces' pods and the
# nodes sit in the VPC's), link-local (169.254.169.254 the instance metadata service with the node
# role's credentials, 169.254.170.23 the Pod Identity agent) and carrier-grade NAT (custom pod networking).
NON_PUBLIC_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")
DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
# The EKS Pod Identity agent: a hostNetwork DaemonSet serving credentials on a link-local address of
# every node, port 80 (aws/eks-pod-identity-agent v0.1.37 configuration/config.go DefaultIpv4TargetHost
# and DefaultIpv6TargetHost; cmd/server.go --port default 80, the chart's daemonset.yaml passes 80;
# EKS User Guide, "EKS Pod Identity considerations"). Its other port (2703) is its probe, localhost only.
POD_IDENTITY_AGENT_CIDRS = ("169.254.170.23/32", "fd00:ec2::23/128")
POD_IDENTITY_AGENT_PORT = 80


def service_account(ns: str, team: str) -> dict:
    """The team's jobs' service account (:data:`TEAM_SERVICE_ACCOUNT`): no API token mounted by
    default and no Role bound, so it means nothing to the Kubernetes API; its one use is the team's
    AWS identity (the Pod Identity association names it)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(TEAM_SERVICE_ACCOUNT, ns, team), "automountServiceAccountToken": False}


def endpoint_peers(addresses: list[str]) -> list[dict]:
    """NetworkPolicy peers of the VPC's interface endpoints (their private addresses, /32 each); never
    empty (a rule whose ``to`` is empty reaches every address)."""
    if not addresses:
        raise ValueError("the VPC's interface endpoints have no addresses")
    return [{"ipBlock": {"cidr": f"{ip}/32"}} for ip in sorted(set(addresses))]


def egress_policy(ns: str, labels: dict[str, str], *, trainer_status: bool = False, pod_identity: bool = False, endpoints: Any = None) -> dict:
    """What the namespace's pods may reach: each other (rendezvous, NCCL/Gloo), cluster DNS, the
    public internet (dataset and model downloads, pip) and, with ``trainer_status`` (the stack turns
    the Trainer's TrainJob progress on), its status server (the manager pods' port, nothing else of that namespace); not
    other namespaces, the nodes or the instance metadata service. With ``pod_identity`` (the team has
    an AWS identity) also the Pod Identity agent's address and port, and nothing else link-local.
    With ``endpoints`` (:func:`endpoint_peers` of the VPC's interface endpoints, or a Pulumi output of
    them: ``network.interfaceEndpoints``) also those addresses on HTTPS, which private DNS gives for
    the AWS APIs; S3 goes through the gateway endpoint to S3's public addresses, which the public
    rule covers. Enforced by the VPC CNI's network-policy agent (on with teams)."""
    rules: list[dict[str, Any]] = [
        {"to": [{"podSelector": {}}]},
        {"to": [DNS], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NON_PUBLIC_RANGES)}}]},
    ]
    if trainer_status:
        trainer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TRAINER_NAMESPACE}}, "podSelector": {"matchLabels": dict(trainer_api.MANAGER_POD_LABELS)}}
        rules.append({"to": [trainer], "ports": [{"protocol": "TCP", "port": trainer_api.STATUS_SERVER_PORT}]})
    if pod_identity:
        rules.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in POD_IDENTITY_AGENT_CIDRS], "ports": [{"protocol": "TCP", "port": POD_IDENTITY_AGENT_PORT}]})
    if endpoints is not None:
        rules.append({"to": endpoints, "ports": [{"protocol": "TCP", "port": vpc_endpoints.HTTPS_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "egress", "namespace": ns, "labels": dict(labels)},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": rules,
        },
    }


def ingress_policy(ns: str, labels: dict[str, str], name: str = "team-isolation") -> dict:
    """Every pod of the namespace accepts ingress only from pods of the same namespace: an empty
    ``podSelector`` in a ``from`` entry without ``namespaceSelector`` means this namespace's pods
    (Kubernetes NetworkPolicy semantics), on every port."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels)},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]},
    }


def role(ns: str, team: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(team_role(team), ns, team), "rules": [dict(r) for r in TEAM_RULES]}


def role_binding(ns: str, team: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(team_role(team), ns, team),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": team_role(team)},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": team_group(team)}],
    }


def runtime_reader_role() -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": RUNTIME_READER}, "rules": [dict(r) for r in RUNTIME_READER_RULES]}


def runtime_reader_binding(teams: list[str]) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": RUNTIME_READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RUNTIME_READER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": team_group(t)} for t in sorted(teams)],
    }


def team_directory(team: str) -> str:
    """The team's directory on the checkpoint file system (relative to its root)."""
    return f"{TENANT_DIR}/{team}"


def efs_volume_handle(file_system_id: str, access_point_id: str) -> str:
    """An EFS static volume through an access point: ``<fs-id>::<fsap-id>`` (aws-efs-csi-driver
    v2.1.13 ``examples/kubernetes/access_points/README.md``; the empty middle field is the sub-path).
    The access point roots every mount at the team's directory and creates it on first use."""
    return f"{file_system_id}::{access_point_id}"


def fsx_volume(file_system_id: str, mount_name: str, team: str) -> tuple[str, str]:
    """(volumeHandle, mountname) of a team's FSx for Lustre static volume: a Lustre sub-directory
    mount. aws-fsx-csi-driver v1.7.0 (``pkg/driver/node.go`` NodePublishVolume) mounts
    ``<dnsname>@tcp:/<mountname>`` and uses the volume id only to serialise calls, so a mountname of
    ``<mountname>/tenants/<team>`` mounts only that directory (which must exist: the Tenants
    component creates it), and a distinct handle per team keeps the volumes apart."""
    return f"{file_system_id}/{team_directory(team)}", f"{mount_name}/{team_directory(team)}"


def tenant_dirs_script(teams: list[str], uid: int) -> str:
    """Shell that creates each team's directory owned by the training user, mode 0755 (idempotent:
    a later run chmods directories the user owns, hence the Job's CAP_FOWNER beside CAP_CHOWN).
    The initializers run as the training user too (k8s/builders/runtimes.py: their init container
    makes their sub-path directory as that user, since the kubelet would make it as root with the
    volume root's mode: kubelet ``makeMounts``, ``GetMode`` then ``SafeMakeDir``). Other teams
    never see the directory: their volumes mount only their own."""
    for t in teams:
        if not DNS_LABEL_RE.fullmatch(t):
            raise ValueError(f"team {t!r} is not a DNS label")
    dirs = " ".join(f"/fs/{team_directory(t)}" for t in sorted(teams))
    return f'set -eu; for d in {dirs}; do mkdir -p "$d"; chmod 0755 "$d"; chown {uid}:{uid} "$d"; done'


"""Namespace of the one-shot Job that creates the teams' directories on FSx for Lustre."""


def checkpoint_volume(
    *, ns: str, storage_type: str, volume_handle: Any, capacity_gib: int, attributes: dict | None = None, mount_options: list[str] | None = None, pv_name: str | None = None
) -> tuple[dict, dict]:
    """A static PersistentVolume on the program-created file system, pre-bound to the RWX claim
    that names it (the two point at each other, so no other claim can take the volume).
    ``pv_name`` defaults to ``<ns>-checkpoints``."""
    pv_name = pv_name or f"{ns}-checkpoints"
    csi: dict[str, Any] = {"driver": "fsx.csi.aws.com" if storage_type == "fsx" else "efs.csi.aws.com", "volumeHandle": volume_handle}
    if attributes:
        csi["volumeAttributes"] = attributes
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": f"{capacity_gib}Gi"},
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "csi": csi,
        # pre-bound to its claim: without claimRef, a claim of another namespace naming this volume
        # (volumeName) could bind it first and read another team's checkpoints
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": CHECKPOINT_CLAIM},
    }
    if mount_options:
        pv_spec["mountOptions"] = list(mount_options)
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name}, "spec": pv_spec}
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CHECKPOINT_CLAIM, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name, "resources": {"requests": {"storage": f"{capacity_gib}Gi"}}},
    }
    return pv, pvc
