"""A team cannot undo its own fences, use another team's quota, run pods outside Kueue, expose
anything beyond the cluster, read another team's code or change what the platform publishes to
it: each attack made through the real API server as each team's principal (impersonation with
its access entry's groups, as EKS maps them), class by class, several members per class. Every
refusal is one line, and nothing is written.

The fences: the team's Role (``k8s/builders/tenants.py`` TEAM_RULES: create and delete TrainJobs and
ConfigMaps, read pods, logs and events), the admission policies (``k8s/builders/admission.py``: the
TrainJob's pods and queue, the ConfigMaps a team may touch), Kueue's defaulting webhook and the
ClusterQueues' namespace selectors (``k8s/builders/kueue.py``)."""

from __future__ import annotations

import copy

import pytest

from k8s.builders import admission, platform_facts
from k8s.builders.kueue import PRIORITY_LABEL, team_queue_name
from k8s.builders.tenants import LOCAL_QUEUE, QUEUE_LABEL, TEAM_LABEL
from tests.e2e.conftest import wait_for
from tests.e2e.test_teams import STACK, TRAINJOB, _torch_runtime, as_team, submit_code, team_job
from tools.cluster.client import ApiError

TEAMS = ("vision", "nlp")
OTHER = {"vision": "nlp", "nlp": "vision"}
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def teams(clusters):
    up = clusters.get(STACK)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    return up, {t: as_team(up, access, t) for t in TEAMS}


def _refused(fn) -> ApiError:
    """The request's refusal (one line, no traceback-like text)."""
    with pytest.raises(ApiError) as err:
        fn()
    assert "\n" not in str(err.value), err.value
    return err.value


def _patch(client, api_version: str, kind: str, name: str, namespace: str | None, body: dict):
    return client.request("PATCH", client.path(api_version, kind, name, namespace), body=body, content_type=MERGE)


def _delete(client, api_version: str, kind: str, name: str, namespace: str | None = None):
    return client.request("DELETE", client.path(api_version, kind, name, namespace))


def _obj(api_version: str, kind: str, name: str, namespace: str | None, **fields) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **fields}


POD_SPEC = {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}
POD_TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": POD_SPEC}
SELECTOR = {"matchLabels": {"app": "x"}}


# --- 1. a team cannot undo its own fences ---------------------------------------------------------
# (name, request as the team in namespace ns with the other team's namespace other, admin's check that nothing changed)
UNDO = {
    # network policies are additive: one of its own that opens egress would undo the fence
    "create-egress-allow-all": lambda c, ns, other: c.create(_obj("networking.k8s.io/v1", "NetworkPolicy", "open", ns, spec={"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]})),
    "create-ingress-allow-all": lambda c, ns, other: c.create(_obj("networking.k8s.io/v1", "NetworkPolicy", "open-in", ns, spec={"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]})),
    "patch-egress-policy": lambda c, ns, other: _patch(c, "networking.k8s.io/v1", "NetworkPolicy", "egress", ns, {"spec": {"egress": [{}]}}),
    "delete-egress-policy": lambda c, ns, other: _delete(c, "networking.k8s.io/v1", "NetworkPolicy", "egress", ns),
    "delete-isolation-policy": lambda c, ns, other: _delete(c, "networking.k8s.io/v1", "NetworkPolicy", "team-isolation", ns),
    # pod security lives in the namespace's labels; the admission policies' binding in its team label
    "namespace-pod-security-privileged": lambda c, ns, other: _patch(c, "v1", "Namespace", ns, None, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
    "namespace-drop-team-label": lambda c, ns, other: _patch(c, "v1", "Namespace", ns, None, {"metadata": {"labels": {TEAM_LABEL: None}}}),
    "delete-namespace": lambda c, ns, other: _delete(c, "v1", "Namespace", ns),
    # quotas
    "patch-resource-quota": lambda c, ns, other: _patch(c, "v1", "ResourceQuota", "team-quota", ns, {"spec": {"hard": {"requests.nvidia.com/gpu": "1000"}}}),
    "delete-resource-quota": lambda c, ns, other: _delete(c, "v1", "ResourceQuota", "team-quota", ns),
    "delete-limit-range": lambda c, ns, other: _delete(c, "v1", "LimitRange", "team-defaults", ns),
    "create-limit-range": lambda c, ns, other: c.create(_obj("v1", "LimitRange", "mine", ns, spec={"limits": [{"type": "Container", "max": {"memory": "1Ti"}}]})),
    # RBAC: no escalation
    "patch-own-role": lambda c, ns, other: _patch(c, "rbac.authorization.k8s.io/v1", "Role", f"team-{ns}", ns, {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    "create-role": lambda c, ns, other: c.create(_obj("rbac.authorization.k8s.io/v1", "Role", "mine", ns, rules=[{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])),
    "bind-cluster-admin": lambda c, ns, other: c.create(_obj("rbac.authorization.k8s.io/v1", "RoleBinding", "mine", ns, roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}, subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"training-platform:team:{ns}"}])),
    "bind-edit": lambda c, ns, other: c.create(_obj("rbac.authorization.k8s.io/v1", "RoleBinding", "mine-edit", ns, roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}, subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"training-platform:team:{ns}"}])),
    "cluster-role-binding": lambda c, ns, other: c.create(_obj("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", f"{ns}-admin", None, roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}, subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": f"training-platform:team:{ns}"}])),
    "widen-runtime-reader": lambda c, ns, other: _patch(c, "rbac.authorization.k8s.io/v1", "ClusterRole", "training-platform:runtime-reader", None, {"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    # the admission policies themselves
    "delete-trainjob-policy": lambda c, ns, other: _delete(c, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", admission.POLICY_NAME),
    "delete-configmap-policy": lambda c, ns, other: _delete(c, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", admission.CONFIGMAP_POLICY_NAME),
    # Kueue's objects: a LocalQueue retargeted at another team's ClusterQueue, quotas, priorities
    "retarget-local-queue": lambda c, ns, other: _patch(c, "kueue.x-k8s.io/v1beta2", "LocalQueue", LOCAL_QUEUE, ns, {"spec": {"clusterQueue": team_queue_name(other)}}),
    "create-local-queue-to-other": lambda c, ns, other: c.create(_obj("kueue.x-k8s.io/v1beta2", "LocalQueue", "borrowed", ns, spec={"clusterQueue": team_queue_name(other)})),
    "delete-local-queue": lambda c, ns, other: _delete(c, "kueue.x-k8s.io/v1beta2", "LocalQueue", LOCAL_QUEUE, ns),
    "patch-own-cluster-queue": lambda c, ns, other: _patch(c, "kueue.x-k8s.io/v1beta2", "ClusterQueue", team_queue_name(ns), None, {"spec": {"namespaceSelector": {}}}),
    "create-workload": lambda c, ns, other: c.create(_obj("kueue.x-k8s.io/v1beta2", "Workload", "mine", ns, spec={"queueName": LOCAL_QUEUE, "podSets": [{"name": "main", "count": 1, "template": {"spec": POD_SPEC}}]})),
    "create-priority-class": lambda c, ns, other: c.create(_obj("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", f"{ns}-top", None, value=1000000)),
    "raise-a-priority-class": lambda c, ns, other: _patch(c, "kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "low", None, {"value": 1000000}),
    "create-kubernetes-priority-class": lambda c, ns, other: c.create(_obj("scheduling.k8s.io/v1", "PriorityClass", f"{ns}-top", None, value=1000000)),
}

# --- 2. a team cannot run pods outside Kueue -------------------------------------------------------
SKIP = {"kueue.x-k8s.io/skip": "true", "kueue.x-k8s.io/pod-suspending-parent": "x"}
BYPASS = {
    "pod": lambda c, ns, other: c.create(_obj("v1", "Pod", "bypass", ns, spec=POD_SPEC)),
    "pod-with-kueue-annotations": lambda c, ns, other: c.create({**_obj("v1", "Pod", "bypass-annotated", ns, spec=POD_SPEC), "metadata": {"name": "bypass-annotated", "namespace": ns, "annotations": SKIP, "labels": {"kueue.x-k8s.io/managed": "true"}}}),
    "deployment": lambda c, ns, other: c.create(_obj("apps/v1", "Deployment", "bypass", ns, spec={"selector": SELECTOR, "template": POD_TEMPLATE})),
    "replica-set": lambda c, ns, other: c.create(_obj("apps/v1", "ReplicaSet", "bypass", ns, spec={"selector": SELECTOR, "template": POD_TEMPLATE})),
    "stateful-set": lambda c, ns, other: c.create(_obj("apps/v1", "StatefulSet", "bypass", ns, spec={"selector": SELECTOR, "serviceName": "x", "template": POD_TEMPLATE})),
    "daemon-set": lambda c, ns, other: c.create(_obj("apps/v1", "DaemonSet", "bypass", ns, spec={"selector": SELECTOR, "template": POD_TEMPLATE})),
    "replication-controller": lambda c, ns, other: c.create(_obj("v1", "ReplicationController", "bypass", ns, spec={"selector": {"app": "x"}, "template": POD_TEMPLATE})),
    "job": lambda c, ns, other: c.create(_obj("batch/v1", "Job", "bypass", ns, spec={"template": {"spec": {**POD_SPEC, "restartPolicy": "Never"}}})),
    "cron-job": lambda c, ns, other: c.create(_obj("batch/v1", "CronJob", "bypass", ns, spec={"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {**POD_SPEC, "restartPolicy": "Never"}}}}})),
    "job-set": lambda c, ns, other: c.create(_obj("jobset.x-k8s.io/v1alpha2", "JobSet", "bypass", ns, spec={"replicatedJobs": [{"name": "w", "template": {"spec": {"template": {"spec": {**POD_SPEC, "restartPolicy": "Never"}}}}}]})),
    "training-runtime": lambda c, ns, other: c.create(_obj("trainer.kubeflow.org/v1alpha1", "TrainingRuntime", "mine", ns, spec={"template": {"spec": {"replicatedJobs": []}}})),
    "cluster-training-runtime": lambda c, ns, other: c.create(_obj("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", f"{ns}-mine", None, spec={"template": {"spec": {"replicatedJobs": []}}})),
    # a TrainJob it created may not be changed: no unsuspending, no relabelling out of the queue
    "unsuspend-a-trainjob": lambda c, ns, other: _patch(c, *TRAINJOB, "held", ns, {"spec": {"suspend": False}}),
    "drop-queue-label": lambda c, ns, other: _patch(c, *TRAINJOB, "held", ns, {"metadata": {"labels": {QUEUE_LABEL: None}}}),
    "trainjob-status": lambda c, ns, other: c.request("PATCH", c.path(*TRAINJOB, "held", ns) + "/status", body={"status": {}}, content_type=MERGE),
    "ephemeral-container": lambda c, ns, other: c.request("PATCH", c.path("v1", "Pod", "any", ns) + "/ephemeralcontainers", body={"spec": {"ephemeralContainers": [{"name": "d", "image": "busybox"}]}}, content_type="application/strategic-merge-patch+json"),
    # exec into its own pods is a team's debugging right (docs/debugging.md); into another team's, never
    "exec-other-team": lambda c, ns, other: c.request("POST", c.path("v1", "Pod", "any", other) + "/exec", params={"command": "sh", "stdout": "true"}),
    "evict": lambda c, ns, other: c.request("POST", c.path("v1", "Pod", "any", ns) + "/eviction", body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "any", "namespace": ns}}),
}

# --- 3. a team cannot expose anything beyond the cluster -------------------------------------------
PORTS = [{"port": 80, "targetPort": 8080}]
EXPOSE = {
    "load-balancer": lambda c, ns, other: c.create(_obj("v1", "Service", "lb", ns, spec={"type": "LoadBalancer", "selector": {"app": "x"}, "ports": PORTS})),
    "node-port": lambda c, ns, other: c.create(_obj("v1", "Service", "np", ns, spec={"type": "NodePort", "selector": {"app": "x"}, "ports": PORTS})),
    "external-ips": lambda c, ns, other: c.create(_obj("v1", "Service", "eip", ns, spec={"selector": {"app": "x"}, "ports": PORTS, "externalIPs": ["203.0.113.10"]})),
    "external-name": lambda c, ns, other: c.create(_obj("v1", "Service", "ext", ns, spec={"type": "ExternalName", "externalName": "example.com"})),
    "endpoints": lambda c, ns, other: c.create(_obj("v1", "Endpoints", "ep", ns, subsets=[{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}])),
    "endpoint-slice": lambda c, ns, other: c.create(_obj("discovery.k8s.io/v1", "EndpointSlice", "eps", ns, addressType="IPv4", endpoints=[{"addresses": ["10.0.0.1"]}])),
    "ingress": lambda c, ns, other: c.create(_obj("networking.k8s.io/v1", "Ingress", "in", ns, spec={"defaultBackend": {"service": {"name": "x", "port": {"number": 80}}}})),
    "port-forward": lambda c, ns, other: c.request("POST", c.path("v1", "Pod", "any", ns) + "/portforward", params={"ports": "80"}),
    "pod-proxy": lambda c, ns, other: c.request("GET", c.path("v1", "Pod", "any", ns) + "/proxy/"),
}
# Gateway API objects, where the cluster serves them (the platform installs none)
GATEWAY = {"Gateway": {"gatewayClassName": "any", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}, "HTTPRoute": {"rules": [{}]}}

# --- 4. a team cannot read another team's code or checkpoints ------------------------------------
READ = {
    "other-configmaps": lambda c, ns, other: c.list("v1", "ConfigMap", other),
    "other-platform-facts": lambda c, ns, other: c.get("v1", "ConfigMap", platform_facts.CONFIGMAP, other),
    "training-configmaps": lambda c, ns, other: c.list("v1", "ConfigMap", "training"),
    "other-trainjobs": lambda c, ns, other: c.list(*TRAINJOB, other),
    "other-pod-logs": lambda c, ns, other: c.request("GET", c.path("v1", "Pod", "any", other) + "/log"),
    "all-configmaps": lambda c, ns, other: c.request("GET", "/api/v1/configmaps"),
    "secrets": lambda c, ns, other: c.list("v1", "Secret", ns),
    "service-account-token": lambda c, ns, other: c.request("POST", c.path("v1", "ServiceAccount", "default", ns) + "/token", body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
    # the other team's checkpoints: its volume is pre-bound to its claim; a claim naming it is not the team's to make
    "claim-the-other-teams-volume": lambda c, ns, other: c.create(_obj("v1", "PersistentVolumeClaim", "theirs", ns, spec={"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"checkpoints-{other}", "resources": {"requests": {"storage": "1Gi"}}})),
    "create-a-volume": lambda c, ns, other: c.create(_obj("v1", "PersistentVolume", f"{ns}-root", None, spec={"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": "/"}})),
    "read-volumes": lambda c, ns, other: c.request("GET", "/api/v1/persistentvolumes"),
}

FORBIDDEN = {**{f"undo/{k}": v for k, v in UNDO.items()}, **{f"bypass/{k}": v for k, v in BYPASS.items()}, **{f"expose/{k}": v for k, v in EXPOSE.items()}, **{f"read/{k}": v for k, v in READ.items()}}


@pytest.mark.parametrize("attack", sorted(FORBIDDEN))
@pytest.mark.parametrize("team", TEAMS)
def test_a_team_is_forbidden(teams, team, attack):
    up, clients = teams
    err = _refused(lambda: FORBIDDEN[attack](clients[team], team, OTHER[team]))
    assert err.status == 403, (attack, err.status, err)


def test_the_fences_are_where_they_were(teams):
    """After every attack above, as the admin: the policies, quotas, queues and namespaces unchanged."""
    up, _ = teams
    admin = up.client()
    for team in TEAMS:
        ns = admin.get("v1", "Namespace", team)["metadata"]["labels"]
        assert ns[TEAM_LABEL] == team and ns["pod-security.kubernetes.io/enforce"] == "restricted", ns
        assert {p["metadata"]["name"] for p in admin.list("networking.k8s.io/v1", "NetworkPolicy", team)} == {"egress", "team-isolation"}
        assert admin.get("kueue.x-k8s.io/v1beta2", "LocalQueue", LOCAL_QUEUE, team)["spec"]["clusterQueue"] == team_queue_name(team)
        assert [q["metadata"]["name"] for q in admin.list("kueue.x-k8s.io/v1beta2", "LocalQueue", team)] == [LOCAL_QUEUE]
        assert admin.get("v1", "ResourceQuota", "team-quota", team)["spec"]["hard"]["requests.nvidia.com/gpu"] != "1000"
        assert {r["metadata"]["name"] for r in admin.list("rbac.authorization.k8s.io/v1", "RoleBinding", team)} == {f"team-{team}"}
        kinds = [("v1", "Pod"), ("v1", "Service"), ("apps/v1", "Deployment"), ("batch/v1", "Job"), ("v1", "PersistentVolumeClaim")]
        assert not [o["metadata"]["name"] for k in kinds for o in admin.list(*k, team) if o["metadata"]["name"] in ("bypass", "bypass-annotated", "lb", "np", "eip", "ext", "theirs")]
    assert admin.get_or_none("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding", admission.POLICY_NAME) is not None


@pytest.mark.parametrize("team", TEAMS)
def test_gateway_objects_are_forbidden_where_the_cluster_serves_them(teams, team):
    up, clients = teams
    try:
        clients[team].kind("gateway.networking.k8s.io/v1", "Gateway")
    except ApiError as err:
        assert err.status == 404, err
        pytest.skip("this cluster serves no Gateway API (the platform installs none)")
    for kind, spec in GATEWAY.items():
        err = _refused(lambda kind=kind, spec=spec: clients[team].create(_obj("gateway.networking.k8s.io/v1", kind, "out", team, spec=spec)))
        assert err.status == 403, err


@pytest.mark.parametrize("team", TEAMS)
def test_rbac_grants_a_team_no_write_but_its_trainjobs_configmaps_secrets_and_exec(teams, team):
    """The class, not only its members: the team's own rules, as the API server resolves them
    (SelfSubjectRulesReview), allow writing nothing in its namespace but TrainJobs and ConfigMaps,
    its jobs' Secrets (write-only: admission decides which creates and deletes) and exec into its
    pods, and nothing at all in the other team's."""
    up, clients = teams
    read = {"get", "list", "watch"}

    def writes(ns: str) -> set[tuple[str, str, str]]:
        review = clients[team].request("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": ns}})
        rules = review["status"]["resourceRules"]
        out = {(g, r, v) for rule in rules for g in rule.get("apiGroups", []) for r in rule.get("resources", []) for v in rule["verbs"] if v not in read}
        # what every authenticated user may ask about itself (system:basic-user)
        return {w for w in out if w[0] not in ("authorization.k8s.io", "authentication.k8s.io")}

    assert writes(team) == {
        ("trainer.kubeflow.org", "trainjobs", "create"), ("trainer.kubeflow.org", "trainjobs", "delete"), ("", "configmaps", "create"), ("", "configmaps", "delete"),
        ("", "secrets", "create"), ("", "secrets", "update"), ("", "secrets", "delete"), ("", "pods/exec", "create"),
    }
    assert writes(OTHER[team]) == set()
    assert writes("training") == set()


# --- 5. a team's TrainJob: in its own queue, suspended, within its quota ---------------------------
@pytest.fixture(scope="module")
def held(teams, tmp_path_factory):
    """A job per team that waits in its queue (more GPUs than the whole cohort: never admitted), to
    own, unsuspend and relabel in the attacks."""
    up, clients = teams
    out = {}
    for team in TEAMS:
        configmap, job = team_job(tmp_path_factory.mktemp(team), team, nodes=9, instance_type="g5.12xlarge", name="held", runtime_name=_torch_runtime(up))
        submit_code(clients[team], configmap)
        out[team] = wait_for(f"{team}'s held job created", lambda c=clients[team], j=job: _create_when_ready(c, j), up, timeout=60)
    yield out
    for team in TEAMS:
        up.client().delete(*TRAINJOB, "held", team)


def _create_when_ready(client, job: dict) -> dict | None:
    try:
        return client.create(job)
    except ApiError as err:
        if "not found" in str(err) and "ClusterTrainingRuntime" in str(err):
            return None  # the Trainer's webhook has not seen the runtime yet
        if err.status == 409:
            return client.get(*TRAINJOB, job["metadata"]["name"], job["metadata"]["namespace"])
        raise


def _pod_meta(job: dict) -> dict:
    """The metadata of the pods in the job's own runtime patch."""
    return job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"].setdefault("metadata", {})


def _owned_by(job: dict, parent: dict) -> None:
    job["metadata"]["ownerReferences"] = [{"apiVersion": TRAINJOB[0], "kind": "TrainJob", "name": parent["metadata"]["name"], "uid": parent["metadata"]["uid"], "controller": True}]
    job["metadata"]["labels"].pop(QUEUE_LABEL, None)
    job["spec"]["suspend"] = False


QUEUE_ROUTES = {
    # another queue than its own: another team's, the stack's, one that does not exist
    "queue-of-the-other-team": (lambda j, other, parent: j["metadata"]["labels"].update({QUEUE_LABEL: team_queue_name(other)}), f"metadata.labels.{QUEUE_LABEL}"),
    "queue-named-like-the-other-namespace": (lambda j, other, parent: j["metadata"]["labels"].update({QUEUE_LABEL: other}), f"metadata.labels.{QUEUE_LABEL}"),
    "queue-of-the-stack": (lambda j, other, parent: j["metadata"]["labels"].update({QUEUE_LABEL: "platform-jobs"}), f"metadata.labels.{QUEUE_LABEL}"),
    # priorities it may not use
    "kubernetes-system-priority": (lambda j, other, parent: j["metadata"]["labels"].update({PRIORITY_LABEL: "system-cluster-critical"}), f"metadata.labels.{PRIORITY_LABEL}"),
    "made-up-priority": (lambda j, other, parent: j["metadata"]["labels"].update({PRIORITY_LABEL: "urgent"}), f"metadata.labels.{PRIORITY_LABEL}"),
    # routes around Kueue: a queued owner (Kueue neither queues nor suspends its "child"), MultiKueue, a prebuilt Workload
    "owned-by-a-queued-job": (lambda j, other, parent: _owned_by(j, parent), "metadata.ownerReferences"),
    "managed-by-multikueue": (lambda j, other, parent: j["spec"].update({"managedBy": "kueue.x-k8s.io/multikueue"}), "spec.managedBy"),
    "prebuilt-workload": (lambda j, other, parent: j["metadata"]["labels"].update({"kueue.x-k8s.io/prebuilt-workload-name": "theirs"}), "metadata: a team's job may carry no Kueue label"),
    "kueue-annotation": (lambda j, other, parent: j["metadata"].setdefault("annotations", {}).update({"kueue.x-k8s.io/skip": "true"}), "metadata: a team's job may carry no Kueue label"),
    # a runtime patch posing as Kueue's (its flavor's node labels): under Kueue's own manager name the
    # CRD's list key refuses it (Kueue's webhook appends its own), under another the policy
    "patch-posing-as-kueue": (lambda j, other, parent: j["spec"]["runtimePatches"].append({**copy.deepcopy(j["spec"]["runtimePatches"][0]), "manager": "kueue.x-k8s.io/manager"}), ("spec.runtimePatches[", "kueue.x-k8s.io/manager")),
    "patch-under-another-kueue-manager": (lambda j, other, parent: j["spec"]["runtimePatches"].append({**copy.deepcopy(j["spec"]["runtimePatches"][0]), "manager": "kueue.x-k8s.io/podset-info"}), "spec.runtimePatches[].manager"),
    # labels and annotations the controllers read, on the JobSet, its Jobs and pods
    "pod-queue-label": (lambda j, other, parent: _pod_meta(j).setdefault("labels", {}).update({QUEUE_LABEL: team_queue_name(other)}), "metadata: a team's job may not set labels or annotations"),
    "pod-kueue-managed-label": (lambda j, other, parent: _pod_meta(j).setdefault("labels", {}).update({"kueue.x-k8s.io/managed": "true"}), "metadata: a team's job may not set labels or annotations"),
    "pod-do-not-disrupt-off": (lambda j, other, parent: _pod_meta(j).setdefault("annotations", {}).update({"karpenter.sh/do-not-disrupt": "false"}), "metadata: a team's job may not set labels or annotations"),
    "jobset-exclusive-zone": (lambda j, other, parent: j["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"].update({"metadata": {"annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "topology.kubernetes.io/zone"}}}), "metadata: a team's job may not set labels or annotations"),
    "job-label-of-the-platform": (lambda j, other, parent: j["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"].update({"metadata": {"labels": {TEAM_LABEL: other}}}), "metadata: a team's job may not set labels or annotations"),
}


@pytest.mark.parametrize("route", sorted(QUEUE_ROUTES))
@pytest.mark.parametrize("team", TEAMS)
def test_a_trainjob_cannot_leave_its_teams_queue(teams, held, tmp_path, team, route):
    up, clients = teams
    change, field = QUEUE_ROUTES[route]
    configmap, job = team_job(tmp_path, team, name=f"route-{route}"[:40].rstrip("-"), runtime_name=_torch_runtime(up))
    change(job, OTHER[team], held[team])
    submit_code(clients[team], configmap)

    def refusal():
        try:
            clients[team].create(job, dry_run=True)
        except ApiError as err:
            return None if "not found" in str(err) and "ClusterTrainingRuntime" in str(err) else err
        return None

    err = wait_for(f"the refusal of {route}", refusal, up, timeout=60)
    err = _refused(lambda: clients[team].create(job))
    assert err.status in (403, 422), err
    assert all(f in str(err) for f in ((field,) if isinstance(field, str) else field)), err
    assert up.client().get_or_none(*TRAINJOB, job["metadata"]["name"], team) is None


@pytest.mark.parametrize("team", TEAMS)
def test_a_trainjob_without_a_queue_label_is_held_in_the_teams_own_queue(teams, tmp_path, team):
    """No queue label and ``suspend: false``: Kueue's webhook puts it in the namespace's ``default``
    queue and suspends it (kueue v0.19.2 ``setDefaultLocalQueue``, ``WorkloadShouldBeSuspended``);
    the policy requires both, so it runs only when Kueue admits it in the team's ClusterQueue."""
    up, clients = teams
    admin = up.client()
    name = "no-queue-label"
    configmap, job = team_job(tmp_path, team, name=name, runtime_name=_torch_runtime(up))
    for key in (QUEUE_LABEL, PRIORITY_LABEL):
        job["metadata"]["labels"].pop(key, None)
    job["spec"]["suspend"] = False
    submit_code(clients[team], configmap)
    try:
        stored = wait_for("the unlabelled job created", lambda: _create_when_ready(clients[team], job), up, timeout=60)
        assert stored["metadata"]["labels"][QUEUE_LABEL] == LOCAL_QUEUE
        assert stored["spec"]["suspend"] is True

        def workload():
            for w in admin.list(*WORKLOAD, team):
                if any(r["name"] == name for r in w["metadata"].get("ownerReferences", [])):
                    return w
            return None

        w = wait_for("its Workload", workload, up, timeout=60)
        assert w["spec"]["queueName"] == LOCAL_QUEUE
        admitted = wait_for("its admission", lambda: ((admin.get(*WORKLOAD, w["metadata"]["name"], team).get("status") or {}).get("admission")), up, timeout=90)
        assert admitted["clusterQueue"] == team_queue_name(team), admitted
    finally:
        admin.delete(*TRAINJOB, name, team)


def test_kueue_alone_would_let_an_owned_job_run_unqueued(teams, held):
    """Why the owner fence: outside the team namespaces (the stack's own, as the admin), Kueue's
    webhook gives a TrainJob owned by a queued TrainJob no queue and leaves it unsuspended, so the
    Trainer would run it outside every quota (a dry run shows what would be stored). In a team's
    namespace the policy refuses it, whoever asks."""
    up, _ = teams
    admin = up.client()
    parent = next(j for j in admin.list(*TRAINJOB, "training") if QUEUE_LABEL in j["metadata"].get("labels", {}))
    child = {"apiVersion": TRAINJOB[0], "kind": "TrainJob", "metadata": {"name": "child", "namespace": "training", "labels": {}}, "spec": copy.deepcopy(parent["spec"])}
    child["spec"].pop("runtimePatches", None)
    _owned_by(child, parent)
    would_be = admin.create(child, dry_run=True)
    assert QUEUE_LABEL not in (would_be["metadata"].get("labels") or {}) and would_be["spec"].get("suspend") is not True, would_be["metadata"]

    team_parent = held["vision"]
    child = {"apiVersion": TRAINJOB[0], "kind": "TrainJob", "metadata": {"name": "child", "namespace": "vision", "labels": {}}, "spec": copy.deepcopy(team_parent["spec"])}
    child["spec"]["runtimePatches"] = [p for p in child["spec"]["runtimePatches"] if not p["manager"].startswith("kueue.x-k8s.io/")]
    _owned_by(child, team_parent)
    err = _refused(lambda: admin.create(child, dry_run=True))
    assert "metadata.ownerReferences" in str(err), err


# --- 6. what the platform publishes in a team's namespace -----------------------------------------
@pytest.mark.parametrize("team", TEAMS)
def test_a_team_changes_only_its_code_configmaps(teams, team):
    up, clients = teams
    c = clients[team]
    facts_before = up.client().get("v1", "ConfigMap", platform_facts.CONFIGMAP, team)["data"]
    attempts = {
        "delete-platform-facts": lambda: _delete(c, "v1", "ConfigMap", platform_facts.CONFIGMAP, team),
        "delete-cluster-ca": lambda: _delete(c, "v1", "ConfigMap", "kube-root-ca.crt", team),
        "create-notes": lambda: c.create(_obj("v1", "ConfigMap", "notes", team, data={"a": "b"})),
        "code-named-with-platform-label": lambda: c.create({**_obj("v1", "ConfigMap", admission.CODE_CONFIGMAP_PREFIX + "x", team, data={"a": "b"}), "metadata": {"name": admission.CODE_CONFIGMAP_PREFIX + "x", "namespace": team, "labels": {TEAM_LABEL: team}}}),
    }
    for what, attempt in attempts.items():
        err = _refused(attempt)
        assert err.status == 403 and "configmaps/" in str(err) and admission.CODE_CONFIGMAP_PREFIX in str(err), (what, err)
    patch = _refused(lambda: _patch(c, "v1", "ConfigMap", platform_facts.CONFIGMAP, team, {"data": {platform_facts.KEY: "{}"}}))
    assert patch.status == 403, patch
    assert up.client().get("v1", "ConfigMap", platform_facts.CONFIGMAP, team)["data"] == facts_before
    assert up.client().get_or_none("v1", "ConfigMap", "kube-root-ca.crt", team) is not None
    # its code it may create and delete
    code = _obj("v1", "ConfigMap", admission.CODE_CONFIGMAP_PREFIX + "fence-test", team, data={"train.py": "print(1)\n"})
    c.create(code)
    _delete(c, "v1", "ConfigMap", code["metadata"]["name"], team)
    assert up.client().get_or_none("v1", "ConfigMap", code["metadata"]["name"], team) is None


def test_a_trainjob_of_the_team_mounts_only_its_own_checkpoint_directory(teams):
    """Each team's claim is bound to a volume of the team's own directory, pre-bound both ways."""
    up, _ = teams
    admin = up.client()
    for team in TEAMS:
        claim = admin.get("v1", "PersistentVolumeClaim", "checkpoints", team)
        volume = admin.get("v1", "PersistentVolume", claim["spec"]["volumeName"])
        assert volume["spec"]["claimRef"]["namespace"] == team and volume["spec"]["claimRef"]["name"] == "checkpoints"
        assert volume["metadata"]["labels"][TEAM_LABEL] == team
        assert f"tenants/{team}" in str(volume["spec"]["csi"]), volume["spec"]["csi"]

