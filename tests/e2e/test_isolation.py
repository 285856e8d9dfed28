"""Tenant isolation proven by attacks through the real API server, as a team's principal
(impersonation with its access entry's groups): every escape is refused by RBAC, the admission
policy (k8s/builders/admission.py, evaluated by the API server) or Pod Security, each saying which field."""

from __future__ import annotations

import copy

import pytest

from k8s.builders import trainer_api
from tests.e2e.conftest import stack_file, wait_for
from tests.e2e.test_teams import STACK, TRAINJOB, _torch_runtime, as_team, submit, submit_code, team_job
from tools.cluster.client import ApiError


@pytest.fixture(scope="module")
def team(clusters):
    up = clusters.get(STACK)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    return up, as_team(up, access, "vision")


def pool_instance_types(up) -> list[str]:
    """Every instance type the stack's NodePools may launch (their instance-type requirement)."""
    return sorted({v for o in up.plan.objects if o["kind"] == "NodePool" for r in o["spec"]["template"]["spec"]["requirements"] if r["key"] == "node.kubernetes.io/instance-type" for v in r["values"]})


def _hostile(tmp_path, up, name: str, change) -> tuple[dict, dict]:
    configmap, job = team_job(tmp_path, "vision", name=name, runtime_name=_torch_runtime(up))
    job = copy.deepcopy(job)
    change(trainer_api.read_pod_customization(job["spec"]))
    return configmap, job


def _required(key: str, op: str, values: list[str] | None = None) -> dict:
    term = {"key": key, "operator": op, **({"values": values} if values else {})}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [term]}]}}}


def _mount(ps: dict, **mount) -> None:
    """The checkpoint mount of the node container, changed (volumeMounts are a list keyed by name)."""
    next(m for m in ps["containers"][0]["volumeMounts"] if m["name"] == "checkpoints").update(mount)


# the system node groups of the stack (what a team must never land on)
SYSTEM_GROUPS = stack_file(STACK)["config"]["training-platform:nodeGroups"]
SYSTEM_TYPES = sorted(g["instanceType"] for g in SYSTEM_GROUPS.values())
ESCAPES = {
    "nfs-volume": (lambda ps: ps["volumes"].append({"name": "x", "nfs": {"server": "10.0.0.1", "path": "/"}}), "volumes"),
    "host-path-volume": (lambda ps: ps["volumes"].append({"name": "x", "hostPath": {"path": "/var/run"}}), "volumes"),
    "ephemeral-volume-naming-a-volume": (lambda ps: ps["volumes"].append({"name": "x", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteMany"], "volumeName": "checkpoints-nlp", "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}}}}), "volumes"),
    "csi-inline-volume": (lambda ps: ps["volumes"].append({"name": "x", "csi": {"driver": "fsx.csi.aws.com", "volumeAttributes": {"mountname": "fsx/tenants/nlp"}}}), "volumes"),
    "secret-volume": (lambda ps: ps["volumes"].append({"name": "x", "secret": {"secretName": "any"}}), "volumes"),
    "projected-token": (lambda ps: ps["volumes"].append({"name": "x", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "sts.amazonaws.com"}}]}}), "volumes"),
    "system-node-selector": (lambda ps: ps["nodeSelector"].update({"training-platform/node-role": "system"}), "nodeSelector"),
    "system-arch-selector": (lambda ps: ps["nodeSelector"].update({"training-platform/arch": "arm64"}), "nodeSelector"),
    "arm-only-selector": (lambda ps: ps["nodeSelector"].update({"kubernetes.io/arch": "arm64"}), "nodeSelector"),
    "node-group-selector": (lambda ps: ps["nodeSelector"].update({"eks.amazonaws.com/nodegroup": "x86"}), "nodeSelector"),
    "hostname-selector": (lambda ps: ps["nodeSelector"].update({"kubernetes.io/hostname": "x86-0"}), "nodeSelector"),
    "system-pool": (lambda ps: ps["nodeSelector"].update({"training-platform/pool": "system-nodes"}), "nodeSelector.training-platform/pool"),
    **{f"system-instance-type-{t.replace('.', '-')}": (lambda ps, t=t: ps["nodeSelector"].update({"node.kubernetes.io/instance-type": t}), "nodeSelector.node.kubernetes.io/instance-type") for t in SYSTEM_TYPES},
    "cpu-instance-type": (lambda ps: ps["nodeSelector"].update({"node.kubernetes.io/instance-type": "m5.large"}), "nodeSelector.node.kubernetes.io/instance-type"),
    "efa-label-value": (lambda ps: ps["nodeSelector"].update({"training-platform/efa": "false"}), "nodeSelector.training-platform/efa"),
    "node-affinity": (lambda ps: ps.update({"affinity": _required("eks.amazonaws.com/nodegroup", "Exists")}), "affinity"),
    "node-affinity-system-type": (lambda ps: ps.update({"affinity": _required("node.kubernetes.io/instance-type", "In", SYSTEM_TYPES)}), "affinity"),
    "preferred-node-affinity": (lambda ps: ps.update({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {"matchExpressions": [{"key": "training-platform/node-role", "operator": "In", "values": ["system"]}]}}]}}}), "affinity"),
    "pod-affinity-to-system-pods": (lambda ps: ps.update({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}, "labelSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]}}}), "affinity"),
    "zone-wide-anti-affinity": (lambda ps: ps.update({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "topology.kubernetes.io/zone", "namespaceSelector": {}, "labelSelector": {}}]}}}), "affinity"),
    "tolerate-all": (lambda ps: ps.update({"tolerations": [{"operator": "Exists"}]}), "tolerations"),
    "tolerate-critical-addons": (lambda ps: ps.update({"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}), "tolerations"),
    "tolerate-control-plane": (lambda ps: ps.update({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}), "tolerations"),
    "tolerate-unschedulable": (lambda ps: ps.update({"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]}), "tolerations"),
    "privileged": (lambda ps: ps["containers"][0].update({"securityContext": {"privileged": True}}), "securityContext"),
    "root": (lambda ps: ps.update({"securityContext": {"runAsUser": 0}}), "securityContext"),
    "service-account": (lambda ps: ps.update({"serviceAccountName": "builder"}), "serviceAccountName"),
    "sub-path-climbs": (lambda ps: _mount(ps, subPath="../nlp"), "containers[].volumeMounts[].subPath"),
    "sub-path-climbs-deeper": (lambda ps: _mount(ps, subPath="x/../../nlp"), "containers[].volumeMounts[].subPath"),
    "sub-path-absolute": (lambda ps: _mount(ps, subPath="/fs/tenants/nlp"), "containers[].volumeMounts[].subPath"),
    "sub-path-expr": (lambda ps: _mount(ps, subPathExpr="$(NODE_NAME)/.."), "containers[].volumeMounts[].subPath"),
    "nvidia-visible-devices": (lambda ps: ps["containers"][0].update({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}), "containers[].env"),
    "nvidia-driver-capabilities-init": (lambda ps: ps.update({"initContainers": [{"name": "x", "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}]}), "containers[].env"),
    "scheduling-gates": (lambda ps: ps.update({"schedulingGates": [{"name": "example.com/hold"}]}), "schedulingGates"),
    "image-pull-secrets": (lambda ps: ps.update({"imagePullSecrets": [{"name": "any"}]}), "imagePullSecrets"),
    "grace-period": (lambda ps: ps.update({"terminationGracePeriodSeconds": 86400}), "terminationGracePeriodSeconds"),
}


def _initializer_patch(pod_spec: dict):
    """A whole-job change: a runtime patch (v2.3) for the model initializer's pods (system nodes)."""
    def change(job: dict) -> None:
        jobs = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        jobs.append({"name": "model-initializer", "template": {"spec": {"template": {"spec": pod_spec}}}})
    return change


# changes of the TrainJob beyond the trainer pods' spec (the teams stack runs Trainer v2.3)
JOB_ESCAPES = {
    "trainer-nvidia-env": (lambda job: job["spec"]["trainer"].setdefault("env", []).append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}), "spec.trainer.env"),
    "initializer-env": (lambda job: job["spec"].update({"initializer": {"dataset": {"storageUri": "hf://x/y", "env": [{"name": "LD_PRELOAD", "value": "/workspace/x.so"}]}}}), "spec.initializer.dataset.env"),
    "initializer-patch-env": (_initializer_patch({"containers": [{"name": "model-initializer", "env": [{"name": "PYTHONPATH", "value": "/workspace"}]}]}), "model-initializer jobs run on the system nodes"),
    "initializer-patch-volume": (_initializer_patch({"volumes": [{"name": "x", "emptyDir": {}}], "initContainers": [{"name": "x", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}]}), "model-initializer jobs run on the system nodes"),
}


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_trainjob_that_escapes_its_pods_is_refused_naming_the_field(team, tmp_path, escape):
    up, vision = team
    change, field = ESCAPES[escape]
    configmap, job = _hostile(tmp_path, up, f"escape-{escape}", change)
    _refused_naming(up, vision, configmap, job, escape, field)


@pytest.mark.parametrize("escape", sorted(JOB_ESCAPES))
def test_a_trainjob_that_sets_gpu_env_or_patches_the_system_node_jobs_is_refused(team, tmp_path, escape):
    up, vision = team
    change, field = JOB_ESCAPES[escape]
    configmap, job = team_job(tmp_path, "vision", name=f"escape-{escape}", runtime_name=_torch_runtime(up))
    job = copy.deepcopy(job)
    change(job)
    _refused_naming(up, vision, configmap, job, escape, field)


def _refused_naming(up, vision, configmap: dict, job: dict, escape: str, field: str) -> None:
    submit_code(vision, configmap)

    def refusal():
        # the API server loads a new policy a moment after it is created: until then, ask in a dry run
        try:
            vision.create(job, dry_run=True)
        except ApiError as err:
            if "not found" in str(err) and "ClusterTrainingRuntime" in str(err):
                return None  # the Trainer's webhook has not seen the runtime yet
            return err
        return None

    err = wait_for(f"the refusal of {escape}", refusal, up, timeout=60)
    with pytest.raises(ApiError) as created:
        vision.create(job)
    assert created.value.status == err.status and err.status in (403, 422), err
    message = str(created.value)
    assert "training-platform-team-trainjobs" in message or "runtimePatches" in message, message
    assert field in message, message
    assert up.client().get_or_none(*TRAINJOB, f"escape-{escape}", "vision") is None


HOST_FIELDS = {
    "host-network": (lambda ps: ps.update({"hostNetwork": True, "hostPID": True}), ("hostNetwork", "hostPID")),
    "host-ipc": (lambda ps: ps.update({"hostIPC": True}), ("hostIPC",)),
    "host-port": (lambda ps: ps["containers"][0].update({"ports": [{"containerPort": 8080, "hostPort": 80}]}), ("hostPort", "ports")),
}


@pytest.mark.parametrize("what", sorted(HOST_FIELDS))
def test_host_namespaces_and_ports_cannot_even_be_written(team, tmp_path, what):
    """The patch's pod spec has no hostNetwork/hostPID/hostIPC and its containers no ports (the
    CRD schema): the field never reaches a pod, so nothing is exposed on a node's address."""
    up, vision = team
    change, fields = HOST_FIELDS[what]
    name = f"escape-{what}"
    configmap, job = _hostile(tmp_path, up, name, change)
    try:
        submit_code(vision, configmap)
        vision.create(job, strict=True)
    except ApiError as err:  # strict validation refuses it outright, naming the field
        assert "unknown field" in str(err) and any(f in str(err) for f in fields), err
        assert up.client().get_or_none(*TRAINJOB, name, "vision") is None
        return
    stored = up.client().get(*TRAINJOB, name, "vision")
    assert not any(f in str(stored) for f in fields), stored


@pytest.mark.parametrize("kind", [("v1", "Pod"), ("batch/v1", "Job"), ("jobset.x-k8s.io/v1alpha2", "JobSet")])
def test_a_team_cannot_bypass_the_queue_with_bare_pods_jobs_or_jobsets(team, kind):
    up, vision = team
    api_version, k = kind
    obj = {"apiVersion": api_version, "kind": k, "metadata": {"name": "bypass", "namespace": "vision"}, "spec": {}}
    with pytest.raises(ApiError) as err:
        vision.create(obj)
    assert err.value.status == 403, err.value


def test_team_namespaces_enforce_restricted_pod_security(team):
    up, _ = team
    ns = up.client().get("v1", "Namespace", "vision")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # and the API server enforces it: a root pod is refused even for the admin
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root-pod", "namespace": "vision"},
           "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"runAsUser": 0}}]}}
    with pytest.raises(ApiError) as err:
        up.client().create(pod, dry_run=True)
    assert err.value.status == 403 and "restricted" in str(err.value), err.value


def test_a_normal_team_trainjob_is_admitted_and_runs_on_a_gpu_pool(team, tmp_path):
    up, vision = team
    configmap, job = team_job(tmp_path, "vision", nodes=2, name="vision-normal", runtime_name=_torch_runtime(up))
    submit(vision, configmap, job)
    admin = up.client()

    def placed():
        pods = admin.list("v1", "Pod", "vision", label_selector="jobset.sigs.k8s.io/jobset-name=vision-normal")
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = wait_for("vision-normal's pods on nodes", placed, up, timeout=240)
    for pod in pods:
        node = admin.get("v1", "Node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"].get("training-platform/pool") == "gpu-pool", node["metadata"]["labels"]
    wait_for("vision-normal Complete", lambda: any(c["type"] == "Complete" and c["status"] == "True" for c in (admin.get(*TRAINJOB, "vision-normal", "vision").get("status") or {}).get("conditions") or []), up, timeout=240)


# Trainer v2.1.0 ContainerOverride/PodSpecOverride: no securityContext, no terminationGracePeriodSeconds
V21_HAS_NO_FIELD = {"privileged": "securityContext", "root": "securityContext", "grace-period": "terminationGracePeriodSeconds"}


def test_trainer_v2_1_pod_template_overrides_are_fenced_the_same_way(clusters, tmp_path):
    """The workshop stack (Trainer v2.1.0) has no teams; the policy is applied there with a
    team-labelled namespace, and v2.1's podTemplateOverrides shape is refused on the same fields."""
    from k8s.builders import admission
    from k8s.builders.tenants import TEAM_LABEL
    from trainctl import code, objects

    up = clusters.get("workshop")
    admin = up.client()
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-v21", "labels": {TEAM_LABEL: "team-v21"}}})
    admin.apply(admission.trainjob_policy(["gpu-pool"], instance_types=pool_instance_types(up)))
    admin.apply(admission.trainjob_policy_binding())
    runtime = next(o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["labels"].get("training-platform/runtime") == "torch-distributed-gpu")
    (tmp_path / "train.py").write_text("print(1)\n")
    bundle = code.collect(tmp_path)

    def job(name, change=None):
        req = objects.Request(namespace="team-v21", nodes=1, command=["python", "train.py"], name=name, runtime_name=runtime, trainer_version="v2.1.0")
        configmap, tj = objects.build(req, bundle)
        assert "podTemplateOverrides" in tj["spec"]
        if change:
            change(trainer_api.read_pod_customization(tj["spec"]))
        return configmap, tj

    def refused(obj) -> str:
        # a new policy takes a moment to be served by the API server's policy cache
        def attempt():
            try:
                admin.create(obj, dry_run=True)
            except ApiError as err:
                # the Trainer's webhook may not see a just-applied runtime yet: only the policy's answer counts
                return str(err) if "ValidatingAdmissionPolicy" in str(err) else None
            return None

        return wait_for("the policy to refuse", attempt, up, timeout=30)

    configmap, _ = job("plain")
    admin.create(configmap)
    for name, (change, field) in sorted(ESCAPES.items()):
        if name in V21_HAS_NO_FIELD:  # v2.1's override has no securityContext: the API server drops it
            def stored_spec(obj=job(f"v21-{name}", change)[1]):
                try:
                    return admin.create(obj, dry_run=True)["spec"]
                except ApiError as err:
                    if "not found" in str(err):  # the Trainer's webhook has not seen the runtime yet
                        return None
                    raise

            spec = wait_for("the dry run", stored_spec, up, timeout=30)
            assert V21_HAS_NO_FIELD[name] not in str(spec), spec
            continue
        message = refused(job(f"v21-{name}", change)[1])
        assert "spec.podTemplateOverrides[].spec." + field in message, message
    admin.create(job("plain")[1], dry_run=True)  # a plain job passes
