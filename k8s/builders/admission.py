"""Pure builders for the admission policies of the team namespaces: what a team's TrainJob may
change of the pods it runs and of how it is queued, and which ConfigMaps a team may touch
(:func:`configmap_policy`). Each a ValidatingAdmissionPolicy (``admissionregistration.k8s.io/v1``, GA since
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
* nodeSelector: only the keys the platform's jobs use (instance type, zone, EFA, GPU pool), and
  their values only what a GPU pool's nodes carry: the pool one of the GPU pools, the instance type
  one the GPU pools launch (never a system node group's type), EFA ``true``. Keys alone are not
  enough: ``node.kubernetes.io/instance-type: c6i.2xlarge`` names the system nodes;
* no affinity of any kind: node affinity could name the system nodes, and a required pod
  anti-affinity is also checked against every pod that comes later (the scheduler's symmetry), so
  one job could keep other teams' pods off a whole zone;
* tolerations only of the GPU (and EFA) taints;
* no privileged, privilege-escalating or capability-adding containers, no root user, no sysctls,
  and no service account but the namespace's ``default`` or the team's own (``k8s/builders/tenants.py``
  TEAM_SERVICE_ACCOUNT, the one its AWS identity is associated with); the TrainJob's pod patch has no
  ``automountServiceAccountToken`` (kubeflow/trainer v2.3.0 ``PodSpecPatch``, v2.1.0
  ``PodTemplateSpecOverride``), so the runtimes' setting stands;
* volume mounts: no ``subPathExpr`` and no ``subPath`` that is absolute or climbs (``..``);
* env: no ``NVIDIA_*`` variable in any container or init container (nor in ``spec.trainer.env``):
  the device plugin hands a container its GPUs as ``NVIDIA_VISIBLE_DEVICES`` (its default device
  list strategy ``envvar``) and the NVIDIA container toolkit also honours that variable from an
  unprivileged container's own env by default, so ``NVIDIA_VISIBLE_DEVICES=all`` with 0 or 1 GPU
  requested would expose every GPU of the node, outside the team's quota. Any other variable may be
  a plain value or a ``valueFrom`` (``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``,
  ``resourceFieldRef``): each reads only the job's own namespace or its own pod, which the team's
  code can read anyway (a Secret through ``secretKeyRef`` is how a job gets a credential:
  docs/env-and-secrets.md; which Secrets a team may write: :func:`secret_policy`);
* no ``schedulingGates`` (a gated pod holds its admitted quota while it never schedules; Kueue's
  own gates are Kueue's), no ``imagePullSecrets`` (the nodes pull the platform's images), no
  ``terminationGracePeriodSeconds`` (a job's grace period is its runtime variant's, and Kueue's
  Trainer types drop the field anyway: ``k8s/builders/trainer_api.py`` KUEUE_DROPPED_FIELDS);
* labels and annotations of the JobSet, its Jobs and pods: none in the domains of the controllers
  that queue, place or fence the job (Kueue, JobSet, the Trainer, Karpenter, Kubernetes, the platform).

The initializer jobs (``dataset-initializer``, ``model-initializer``) run on the system nodes
(``k8s/builders/runtimes.py``: node role ``system``), so a patch or override naming them may carry pod
metadata only (what the platform's builders emit: the content-key annotation), never a pod spec
(env, volumes, mounts, init containers: team code or settings on the system nodes); and
``spec.initializer.{dataset,model}.env`` only the variables the platform sets
(:data:`INITIALIZER_ENV`).

And of the TrainJob itself (:func:`trainjob_checks`): no owner (Kueue neither queues nor suspends a
job whose controller owner is a job it manages: kueue v0.19.2 ``pkg/controller/jobframework``
``IsOwnerManagedByKueueForObject``, ``FindAncestorJobManagedByKueue``), run by the Trainer
(``spec.managedBy``), no Kueue labels but the queue and priority and no Kueue annotations, Kueue's
own runtime patch empty; with Kueue, in the namespace's own queue, suspended (Kueue's defaulting
webhook has run by then: validating admission follows all mutation) and of one of the platform's
priorities.

Only CREATE is checked: teams may create and delete TrainJobs but not update them (their Role,
``k8s/builders/tenants.py`` TEAM_RULES); updates come from the controllers (Kueue writes its own patch with
the flavor's node labels, the Trainer its status).
"""

from __future__ import annotations

from collections.abc import Sequence

from k8s.builders.gpu_objects import EFA_LABEL, POOL_LABEL
from k8s.builders.runtimes import INITIALIZED_KEY_ENV
from k8s.builders.tenants import CODE_PREFIX, QUEUE_LABEL, TEAM_LABEL, TEAM_SERVICE_ACCOUNT, team_group
from k8s.builders.trainer_api import DATASET_INITIALIZER, MODEL_INITIALIZER

POLICY_NAME = "training-platform-team-trainjobs"
ALLOWED_VOLUMES = ("configMap", "persistentVolumeClaim", "emptyDir", "downwardAPI")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ALLOWED_SELECTOR_KEYS = (INSTANCE_TYPE_LABEL, "topology.kubernetes.io/zone", EFA_LABEL, POOL_LABEL)
ALLOWED_TOLERATION_KEYS = ("nvidia.com/gpu", "vpc.amazonaws.com/efa")
# Label and annotation keys of the controllers that queue, place and fence a job: Kueue
# (kueue.x-k8s.io), JobSet (jobset.sigs.k8s.io, alpha.jobset.sigs.k8s.io: its exclusive-placement
# annotations add pod (anti-)affinity), the Trainer (trainer.kubeflow.org), Karpenter (karpenter.sh),
# Kubernetes (kubernetes.io, k8s.io) and the platform (training-platform/): a domain or any subdomain.
RESERVED_KEY_RE = "^([^/]*[.])?(x-k8s[.]io|k8s[.]io|kubernetes[.]io|kubeflow[.]org|karpenter[.]sh|training-platform)/"
KUEUE_PREFIX = "kueue.x-k8s.io/"
PRIORITY_LABEL = KUEUE_PREFIX + "priority-class"
# kubeflow/trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go ManagedBy: the default (the CRD
# defaults it before admission); 'kueue.x-k8s.io/multikueue' hands the job to Kueue, and the Trainer
# then never runs it
TRAINER_MANAGER = "trainer.kubeflow.org/trainjob-controller"
# The runtime patch Kueue's TrainJob webhook appends on create, empty (kueue v0.19.2
# pkg/controller/jobs/trainjob/trainjob_webhook.go Default: manager runtimePatchManagerName,
# trainingRuntimeSpec.template.spec {}); Kueue fills it with the flavor's node labels when it admits.
KUEUE_PATCH_MANAGER_PREFIX = KUEUE_PREFIX
# Env a team may not set: the NVIDIA container toolkit's. NVIDIA/k8s-device-plugin (v0.20.0, the
# chart we pin): --device-list-strategy defaults to "envvar", the GPUs given to a container as its
# NVIDIA_VISIBLE_DEVICES; NVIDIA/nvidia-container-toolkit internal/config/config.go
# (accept-nvidia-visible-devices-envvar-when-unprivileged, default true): the runtime hook then
# also reads the variable from an unprivileged container's own env, so a team's
# NVIDIA_VISIBLE_DEVICES=all would get every GPU of the node. The whole NVIDIA_ prefix (driver
# capabilities, MIG config, require/disable-require) is the toolkit's; CUDA_VISIBLE_DEVICES only
# narrows what a process sees of its own devices and stays allowed.
NVIDIA_ENV_PREFIX = "NVIDIA_"
# The service accounts a team's job may run as (any other of the namespace, present or future, is refused)
TEAM_SERVICE_ACCOUNTS = (TEAM_SERVICE_ACCOUNT, "default")
# The replicated jobs of the runtimes that run on the system nodes (k8s/builders/runtimes.py)
SYSTEM_NODE_JOBS = (DATASET_INITIALIZER, MODEL_INITIALIZER)
# What the platform's own builder sets in spec.initializer.*.env (workloads/builders/trainjobs.py initializer)
INITIALIZER_ENV = (INITIALIZED_KEY_ENV,)


def _cel_list(values) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _containers_all(check: str) -> str:
    return f"ps.?containers.orValue([]).all(c, {check}) && ps.?initContainers.orValue([]).all(c, {check})"


def _pod_checks(gpu_pools: Sequence[str], instance_types: Sequence[str]) -> list[tuple[str, str]]:
    """(CEL on ``ps``, a pod spec of the patch, that must hold; the refusal naming field and reason)."""
    volume_kinds = " || ".join(f"has(v.{k})" for k in ALLOWED_VOLUMES)
    selector = "ps.?nodeSelector.orValue({})"
    secure = "!c.?securityContext.?privileged.orValue(false) && !c.?securityContext.?allowPrivilegeEscalation.orValue(false) && c.?securityContext.?capabilities.?add.orValue([]).size() == 0 && c.?securityContext.?runAsUser.orValue(1) != 0"
    mounts = "c.?volumeMounts.orValue([]).all(m, !m.?subPathExpr.hasValue() && !m.?subPath.orValue('').startsWith('/') && !m.?subPath.orValue('').matches('(^|/)[.][.](/|$)'))"
    no_nvidia = f"c.?env.orValue([]).all(e, !e.name.startsWith('{NVIDIA_ENV_PREFIX}'))"
    return [
        (f"ps.?volumes.orValue([]).all(v, {volume_kinds})",
         f"volumes: a team's job may mount only {', '.join(ALLOWED_VOLUMES)} volumes (no hostPath, NFS or other storage outside the team's claims)"),
        (f"{selector}.all(k, k in {_cel_list(ALLOWED_SELECTOR_KEYS)})",
         f"nodeSelector: a team's job may select only {', '.join(ALLOWED_SELECTOR_KEYS)} (not the system nodes or a named node)"),
        (f"!('{POOL_LABEL}' in {selector}) || ps.nodeSelector['{POOL_LABEL}'] in {_cel_list(gpu_pools)}",
         f"nodeSelector.{POOL_LABEL}: must be one of the GPU pools ({', '.join(gpu_pools)})"),
        (f"!('{INSTANCE_TYPE_LABEL}' in {selector}) || ps.nodeSelector['{INSTANCE_TYPE_LABEL}'] in {_cel_list(instance_types)}",
         f"nodeSelector.{INSTANCE_TYPE_LABEL}: must be an instance type the GPU pools launch (not a system node group's)"),
        (f"!('{EFA_LABEL}' in {selector}) || ps.nodeSelector['{EFA_LABEL}'] == 'true'",
         f"nodeSelector.{EFA_LABEL}: only 'true' (the EFA pools' nodes)"),
        ("!ps.?affinity.hasValue()",
         "affinity: a team's job may not set affinity (node affinity could name the system nodes; pod anti-affinity keeps other teams' pods away; its nodes come from the platform's selectors)"),
        (f"ps.?tolerations.orValue([]).all(t, t.?key.orValue('') in {_cel_list(ALLOWED_TOLERATION_KEYS)})",
         f"tolerations: a team's job may tolerate only {', '.join(ALLOWED_TOLERATION_KEYS)} (not every taint, not the system nodes')"),
        (_containers_all(secure),
         "containers[].securityContext: a team's job may not run privileged, escalate privileges, add capabilities or run as root"),
        ("ps.?securityContext.?runAsUser.orValue(1) != 0 && ps.?securityContext.?sysctls.orValue([]).size() == 0",
         "securityContext: a team's job may not run as root or set sysctls"),
        (f"ps.?serviceAccountName.orValue('default') in {_cel_list(TEAM_SERVICE_ACCOUNTS)}",
         f"serviceAccountName: a team's job runs as its namespace's {' or '.join(TEAM_SERVICE_ACCOUNTS)} service account"),
        (_containers_all(mounts),
         "containers[].volumeMounts[].subPath: a team's job may not use subPathExpr or a subPath that is absolute or climbs with '..' (a claim holds only the team's own directory)"),
        (_containers_all(no_nvidia),
         f"containers[].env: a team's job may not set {NVIDIA_ENV_PREFIX}* variables in its containers or initContainers (NVIDIA_VISIBLE_DEVICES=all would expose every GPU of the node, beyond the GPUs it requests)"),
        ("!ps.?schedulingGates.hasValue()",
         "schedulingGates: a team's job may not gate its pods (a gated pod holds the quota it was admitted with and never runs)"),
        ("!ps.?imagePullSecrets.hasValue()",
         "imagePullSecrets: a team's job pulls with the nodes' own credentials, no pull secrets"),
        ("!ps.?terminationGracePeriodSeconds.hasValue()",
         "terminationGracePeriodSeconds: a team's job takes its grace period from its runtime variant, not a patch"),
    ]


def _reserved_keys_free(meta: str) -> str:
    """CEL: the labels and annotations of ``meta`` (an optional metadata) use no reserved key."""
    return f"{meta}.?labels.orValue({{}}).all(k, !k.matches('{RESERVED_KEY_RE}')) && {meta}.?annotations.orValue({{}}).all(k, !k.matches('{RESERVED_KEY_RE}'))"


METADATA_WHY = (
    "metadata: a team's job may not set labels or annotations of the controllers that queue, place or fence it "
    "(kueue.x-k8s.io, jobset.sigs.k8s.io, trainer.kubeflow.org, karpenter.sh, kubernetes.io, k8s.io, training-platform/)"
)


SYSTEM_JOBS_WHY = (
    f"the {' and '.join(SYSTEM_NODE_JOBS)} jobs run on the system nodes; a team's patch for them may set pod labels and annotations only "
    "(no env, volumes, volumeMounts, containers or initContainers)"
)


def trainjob_checks(*, queue: str | None, priorities: Sequence[str]) -> list[tuple[str, str]]:
    """(CEL on the TrainJob ``object`` that must hold; the refusal naming field and reason).
    ``queue``: the LocalQueue every team namespace has when Kueue runs (None without Kueue)."""
    labels = "object.metadata.?labels.orValue({})"
    kueue_patches = f"object.spec.?runtimePatches.orValue([]).filter(p, p.manager.startsWith('{KUEUE_PATCH_MANAGER_PREFIX}'))"
    checks = [
        ("object.metadata.?ownerReferences.orValue([]).size() == 0",
         "metadata.ownerReferences: a team's job has no owner (Kueue neither queues nor suspends a job owned by a job it manages)"),
        (f"object.spec.?managedBy.orValue('{TRAINER_MANAGER}') == '{TRAINER_MANAGER}'",
         f"spec.managedBy: a team's job is run by the Trainer ({TRAINER_MANAGER})"),
        (f"{labels}.all(k, !k.startsWith('{KUEUE_PREFIX}') || k in ['{QUEUE_LABEL}', '{PRIORITY_LABEL}']) && object.metadata.?annotations.orValue({{}}).all(k, !k.startsWith('{KUEUE_PREFIX}'))",
         f"metadata: a team's job may carry no Kueue label but {QUEUE_LABEL} and {PRIORITY_LABEL}, and no Kueue annotation"),
        (f"{kueue_patches}.size() <= 1 && {kueue_patches}.all(p, !p.?trainingRuntimeSpec.?template.?spec.?replicatedJobs.hasValue() && !p.?trainingRuntimeSpec.?template.?metadata.hasValue())",
         f"spec.runtimePatches[].manager: a patch whose manager is {KUEUE_PATCH_MANAGER_PREFIX}... is Kueue's own (empty until Kueue admits the job), not the team's"),
    ]
    for kind in ("dataset", "model"):
        checks.append((
            f"object.spec.?initializer.?{kind}.?env.orValue([]).all(e, e.name in {_cel_list(INITIALIZER_ENV)})",
            f"spec.initializer.{kind}.env: the initializers run on the system nodes; a team's job may set only {', '.join(INITIALIZER_ENV)} there",
        ))
    checks.append((
        f"object.spec.?trainer.?env.orValue([]).all(e, !e.name.startsWith('{NVIDIA_ENV_PREFIX}'))",
        f"spec.trainer.env: a team's job may not set {NVIDIA_ENV_PREFIX}* variables (NVIDIA_VISIBLE_DEVICES=all would expose every GPU of the node, beyond the GPUs it requests)",
    ))
    if queue is not None:
        checks += [
            (f"'{QUEUE_LABEL}' in {labels} && {labels}['{QUEUE_LABEL}'] == '{queue}'",
             f"metadata.labels.{QUEUE_LABEL}: a team's job waits in its namespace's queue '{queue}' (its own quota), nowhere else"),
            ("object.spec.?suspend.orValue(false) == true",
             "spec.suspend: a team's job starts suspended, until Kueue admits it within the team's quota"),
            (f"!('{PRIORITY_LABEL}' in {labels}) || {labels}['{PRIORITY_LABEL}'] in {_cel_list(priorities)}",
             f"metadata.labels.{PRIORITY_LABEL}: one of the platform's priorities ({', '.join(priorities)})"),
        ]
    return checks


def trainjob_policy(gpu_pools: Sequence[str], *, instance_types: Sequence[str], queue: str | None = None, priorities: Sequence[str] = ()) -> dict:
    """Every pod check against both TrainJob shapes: v2.2+ ``runtimePatches`` (each replicated job's
    pod spec) and v2.1 ``podTemplateOverrides`` (each override's pod spec); the metadata check on
    every level they carry; and the TrainJob's own checks. ``instance_types``: every type the GPU
    pools launch; ``queue``: the namespace's LocalQueue with Kueue, ``priorities`` its priority classes."""
    patches = "object.spec.?runtimePatches.orValue([])"
    overrides = "object.spec.?podTemplateOverrides.orValue([])"
    validations = []
    for check, why in _pod_checks(gpu_pools, instance_types):
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
    jobs = "p.?trainingRuntimeSpec.?template.?spec.?replicatedJobs.orValue([])"
    system_jobs = _cel_list(SYSTEM_NODE_JOBS)
    validations.append({
        "expression": f"{patches}.all(p, {jobs}.all(j, !(j.name in {system_jobs}) || !j.?template.?spec.?template.?spec.hasValue()))",
        "message": f"spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template.spec: {SYSTEM_JOBS_WHY}",
        "reason": "Forbidden",
    })
    validations.append({
        "expression": f"{overrides}.all(o, !o.?targetJobs.orValue([]).exists(t, t.name in {system_jobs}) || !o.?spec.hasValue())",
        "message": f"spec.podTemplateOverrides[].spec: {SYSTEM_JOBS_WHY}",
        "reason": "Forbidden",
    })
    meta_in_patch = " && ".join([
        _reserved_keys_free("p.?trainingRuntimeSpec.?template.?metadata"),
        f"{jobs}.all(j, {_reserved_keys_free('j.?template.?metadata')} && {_reserved_keys_free('j.?template.?spec.?template.?metadata')})",
    ])
    validations.append({"expression": f"{patches}.all(p, {meta_in_patch})", "message": f"spec.runtimePatches[].trainingRuntimeSpec.template(.spec.replicatedJobs[].template(.spec.template)).{METADATA_WHY}", "reason": "Forbidden"})
    validations.append({"expression": f"{overrides}.all(o, {_reserved_keys_free('o.?metadata')})", "message": f"spec.podTemplateOverrides[].{METADATA_WHY}", "reason": "Forbidden"})
    for check, why in trainjob_checks(queue=queue, priorities=priorities):
        validations.append({"expression": check, "message": why, "reason": "Forbidden"})
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


CONFIGMAP_POLICY_NAME = "training-platform-team-configmaps"
CODE_CONFIGMAP_PREFIX = f"{CODE_PREFIX}-"
"""How trainctl's code ConfigMaps are named (``workloads/builders/trainjobs.py`` code_configmap_name)."""


def configmap_policy() -> dict:
    """What a team's principals may do with ConfigMaps in their namespace. Their Role lets them
    create and delete ConfigMaps (their code); RBAC cannot narrow ``create`` by name, and a delete
    by name would have to list every name. Without this, a team could delete ``platform-facts``
    (what the platform publishes to trainctl) or ``kube-root-ca.crt`` (the cluster CA its pods
    trust) and create its own in its place. So, for requests from a team group only, the
    ConfigMap created, changed or deleted must be a code ConfigMap (``training-code-<hash>``) and
    carry no platform label."""
    cm = "variables.cm"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": CONFIGMAP_POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["configmaps"]}]},
            "matchConditions": [{"name": "team-principal", "expression": f"request.userInfo.groups.exists(g, g.startsWith('{team_group('')}'))"}],
            "variables": [{"name": "cm", "expression": "request.operation == 'DELETE' ? oldObject : object"}],
            "validations": [{
                "expression": f"{cm}.metadata.name.startsWith('{CODE_CONFIGMAP_PREFIX}') && !('{TEAM_LABEL}' in {cm}.metadata.?labels.orValue({{}}))",
                "message": f"configmaps: a team creates and deletes only its code ConfigMaps ({CODE_CONFIGMAP_PREFIX}<hash>)",
                "messageExpression": f"'configmaps/' + {cm}.metadata.name + ': a team creates and deletes only its code ConfigMaps ({CODE_CONFIGMAP_PREFIX}<hash>, as trainctl names them); what the platform publishes in the namespace is not for the team to change'",
                "reason": "Forbidden",
            }],
        },
    }


def configmap_policy_binding() -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": CONFIGMAP_POLICY_NAME},
        "spec": {
            "policyName": CONFIGMAP_POLICY_NAME,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}},
        },
    }


SECRET_POLICY_NAME = "training-platform-team-secrets"
# A Secret of this type naming a service account in its annotation kubernetes.io/service-account.name is filled with a
# long-lived token of that account by the token controller (kubernetes v1.34 pkg/controller/serviceaccount/
# tokens_controller.go, v1.SecretTypeServiceAccountToken; the documented way to make a long-lived token by hand)
SA_TOKEN_SECRET_TYPE = "kubernetes.io/service-account-token"


# A DELETE that leaves a finalizer pending answers with the stored object, data included: the generic store updates the
# object (deletionTimestamp, finalizers) and returns it (k8s.io/apiserver v0.34.4 pkg/registry/generic/registry/store.go
# Delete: `if !deleteImmediately || err != nil { return out, false, err }`, and `if dryrun.IsDryRun(...) && out != nil
# { return out, true, nil }`). A finalizer is pending when the Secret carries one already, or when the delete options
# add one: propagationPolicy Orphan or orphanDependents true (orphan), Foreground (foregroundDeletion)
# (same file, shouldOrphanDependents, shouldDeleteDependents, deletionFinalizersForGarbageCollection). Unset or
# Background adds none. The admission check runs first, on the stored object (`deleteValidation(ctx, existing)` in
# updateForGracefulDeletionAndFinalizers, storage.ValidateObjectFunc in the plain path): a refusal answers with no object.
# The policy sees the options as request.options (the DeleteOptions) and request.dryRun (k8s.io/apiserver v0.34.4
# pkg/admission/plugin/cel/compile.go BuildRequestType, condition.go CreateAdmissionRequest: Options is
# attr.GetOperationOptions(), DryRun attr.IsDryRun()).
SECRET_DELETE_CHECK = (
    "request.operation != 'DELETE' || (!request.?dryRun.orValue(false)"
    " && request.options.?propagationPolicy.orValue('Background') == 'Background'"
    " && !request.options.?orphanDependents.orValue(false))"
)
SECRET_FINALIZERS_CHECK = "request.operation == 'DELETE' || object.metadata.?finalizers.orValue([]).size() == 0"
SECRET_DELETE_FINALIZED_CHECK = "request.operation != 'DELETE' || oldObject.metadata.?finalizers.orValue([]).size() == 0"


def secret_policy() -> dict:
    """What a team's principals may do with Secrets in their namespace (their Role: create, update
    and delete, never read: ``k8s/builders/tenants.py`` TEAM_RULES). A Secret for a job's
    ``secretEnv`` holds data; a service-account token Secret would have the token controller mint a
    token of any service account of the namespace, one the team's job could then read through a
    ``secretKeyRef`` and use as that account. So, for requests from a team group only, no Secret of
    that type (``type`` is immutable on update: kubernetes v1.34 pkg/apis/core/validation
    ``ValidateSecretUpdate``, so CREATE decides; UPDATE is checked too, as the Role allows it).

    A delete must not be a read either: a DELETE that leaves a finalizer pending answers with the
    Secret, data included (SECRET_DELETE_CHECK's comment). So a team's delete is a plain one (no
    ``dryRun``, ``propagationPolicy`` unset or ``Background``, no ``orphanDependents``), a team's
    Secret never carries ``metadata.finalizers`` (CREATE and UPDATE), and a Secret that carries one
    (put there by someone else) is not the team's to delete."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": SECRET_POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["secrets"]}]},
            "matchConditions": [{"name": "team-principal", "expression": f"request.userInfo.groups.exists(g, g.startsWith('{team_group('')}'))"}],
            "validations": [
                {
                    "expression": f"request.operation == 'DELETE' || object.?type.orValue('Opaque') != '{SA_TOKEN_SECRET_TYPE}'",
                    "message": f"secrets: a team's Secret may not be of type {SA_TOKEN_SECRET_TYPE} (the token controller would fill it with a token of a service account of the namespace); allowed: Opaque and the other types",
                    "reason": "Forbidden",
                },
                {
                    "expression": SECRET_FINALIZERS_CHECK,
                    "message": "secrets: a team's Secret may not carry metadata.finalizers (deleting a Secret with a pending finalizer answers with its data)",
                    "reason": "Forbidden",
                },
                {
                    "expression": SECRET_DELETE_CHECK,
                    "message": "secrets: a team deletes a Secret plainly: no dryRun, propagationPolicy unset or Background, no orphanDependents (the others leave a finalizer pending, and the answer would carry the Secret's data)",
                    "reason": "Forbidden",
                },
                {
                    "expression": SECRET_DELETE_FINALIZED_CHECK,
                    "message": "secrets: this Secret carries metadata.finalizers, so deleting it would answer with its data; a team does not delete it (ask the platform team)",
                    "reason": "Forbidden",
                },
            ],
        },
    }


def secret_policy_binding() -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": SECRET_POLICY_NAME},
        "spec": {
            "policyName": SECRET_POLICY_NAME,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}},
        },
    }
