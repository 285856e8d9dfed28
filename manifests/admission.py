"""Pure builders for the admission policy that fences what a team's TrainJob may change of the
pods it runs: a ValidatingAdmissionPolicy (``admissionregistration.k8s.io/v1``, GA since
Kubernetes 1.30, evaluated by the API server itself) and its binding to the team namespaces.

Why: the Trainer merges a TrainJob's pod customisation into the runtime's pods, and v2.3.0 does not
validate ``volumes``, ``nodeSelector``, ``affinity`` or ``tolerations`` in ``runtimePatches`` (a TODO
in ``pkg/runtime/framework/plugins/jobset/jobset.go``); v2.1.0's ``podTemplateOverrides`` carry the
same fields. Left alone, a team could mount an NFS export or a host path, land on the system nodes
(and their instance role), or tolerate every taint. Pod Security ``restricted`` in the team
namespaces catches privileged pods only when the Job controller creates them (the TrainJob itself is
accepted, its pods then fail to appear); this policy refuses the TrainJob at once, naming the field.

What a team may set, per pod spec in its patches (the Trainer's own fields it may not set are
refused by the CRD schema anyway):

* volumes: ``configMap``, ``persistentVolumeClaim``, ``emptyDir``, ``downwardAPI`` only;
* nodeSelector: only the keys the platform's jobs use (instance type, zone, EFA, GPU pool) and
  the pool only one of the GPU pools;
* no node affinity; tolerations only of the GPU (and EFA) taints;
* no privileged, privilege-escalating or capability-adding containers, no root user, no sysctls,
  and no service account but the namespace's default.

Only CREATE is checked: teams may create and delete TrainJobs but not update them (their Role,
``manifests/tenants.py`` TEAM_RULES); updates come from the controllers (Kueue writes its own patch with
the flavor's node labels, the Trainer its status).
"""

from __future__ import annotations

from manifests.gpu_objects import EFA_LABEL, POOL_LABEL
from manifests.tenants import TEAM_LABEL

POLICY_NAME = "training-platform-team-trainjobs"
ALLOWED_VOLUMES = ("configMap", "persistentVolumeClaim", "emptyDir", "downwardAPI")
ALLOWED_SELECTOR_KEYS = ("node.kubernetes.io/instance-type", "topology.kubernetes.io/zone", EFA_LABEL, POOL_LABEL)
ALLOWED_TOLERATION_KEYS = ("nvidia.com/gpu", "vpc.amazonaws.com/efa")


def _cel_list(values) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _pod_checks(gpu_pools: list[str]) -> list[tuple[str, str]]:
    """(CEL on ``ps``, a pod spec of the patch, that must hold; the refusal naming field and reason)."""
    volume_kinds = " || ".join(f"has(v.{k})" for k in ALLOWED_VOLUMES)
    return [
        (f"ps.?volumes.orValue([]).all(v, {volume_kinds})",
         f"volumes: a team's job may mount only {', '.join(ALLOWED_VOLUMES)} volumes (no hostPath, NFS or other storage outside the team's claims)"),
        (f"ps.?nodeSelector.orValue({{}}).all(k, k in {_cel_list(ALLOWED_SELECTOR_KEYS)})",
         f"nodeSelector: a team's job may select only {', '.join(ALLOWED_SELECTOR_KEYS)} (not the system nodes or a named node)"),
        (f"!('{POOL_LABEL}' in ps.?nodeSelector.orValue({{}})) || ps.nodeSelector['{POOL_LABEL}'] in {_cel_list(gpu_pools)}",
         f"nodeSelector.{POOL_LABEL}: must be one of the GPU pools ({', '.join(gpu_pools)})"),
        ("!ps.?affinity.?nodeAffinity.hasValue()",
         "affinity.nodeAffinity: a team's job may not set node affinity (its pool comes from the platform's selectors)"),
        (f"ps.?tolerations.orValue([]).all(t, t.?key.orValue('') in {_cel_list(ALLOWED_TOLERATION_KEYS)})",
         f"tolerations: a team's job may tolerate only {', '.join(ALLOWED_TOLERATION_KEYS)} (not every taint, not the system nodes')"),
        ("ps.?containers.orValue([]).all(c, !c.?securityContext.?privileged.orValue(false) && !c.?securityContext.?allowPrivilegeEscalation.orValue(false) && c.?securityContext.?capabilities.?add.orValue([]).size() == 0 && c.?securityContext.?runAsUser.orValue(1) != 0)"
         " && ps.?initContainers.orValue([]).all(c, !c.?securityContext.?privileged.orValue(false) && !c.?securityContext.?allowPrivilegeEscalation.orValue(false) && c.?securityContext.?capabilities.?add.orValue([]).size() == 0 && c.?securityContext.?runAsUser.orValue(1) != 0)",
         "containers[].securityContext: a team's job may not run privileged, escalate privileges, add capabilities or run as root"),
        ("ps.?securityContext.?runAsUser.orValue(1) != 0 && ps.?securityContext.?sysctls.orValue([]).size() == 0",
         "securityContext: a team's job may not run as root or set sysctls"),
        ("ps.?serviceAccountName.orValue('default') == 'default'",
         "serviceAccountName: a team's job runs as the namespace's default service account"),
    ]


def trainjob_policy(gpu_pools: list[str]) -> dict:
    """Every check against both TrainJob shapes: v2.2+ ``runtimePatches`` (each replicated job's pod
    spec) and v2.1 ``podTemplateOverrides`` (each override's pod spec)."""
    patches = "object.spec.?runtimePatches.orValue([])"
    overrides = "object.spec.?podTemplateOverrides.orValue([])"
    validations = []
    for check, why in _pod_checks(gpu_pools):
        in_patch = f"p.?trainingRuntimeSpec.?template.?spec.?replicatedJobs.orValue([]).all(j, !j.?template.?spec.?template.?spec.hasValue() || [j.template.spec.template.spec].all(ps, {check}))"
        validations.append({
            "expression": f"{patches}.all(p, {in_patch})",
            "message": f"spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template.spec.{why}",
            "reason": "Forbidden",
        })
        validations.append({
            "expression": f"{overrides}.all(o, !o.?spec.hasValue() || [o.spec].all(ps, {check}))",
            "message": f"spec.podTemplateOverrides[].spec.{why}",
            "reason": "Forbidden",
        })
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["trainjobs"]}]},
            "validations": validations,
        },
    }


def trainjob_policy_binding() -> dict:
    """The policy on every team namespace (labelled with the team), refusing (Deny)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "policyName": POLICY_NAME,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}},
        },
    }
