"""The team TrainJob admission policy as rendered (k8s/builders/admission.py). Its CEL is evaluated by a real
API server in tests/e2e/test_isolation.py (hostile and normal TrainJobs of both Trainer shapes)."""

from __future__ import annotations

import re

import pytest

from config.labels import NODE_ROLE_LABEL
from k8s.builders import admission, platform_facts, trainer_api
from k8s.builders import kueue as kq
from k8s.builders import tenants as tn
from k8s.builders.tenants import TEAM_LABEL
from tests.conftest import dev_config, objects, run_config
from tests.test_tenants import TWO_TEAMS
from workloads.builders import trainjobs as tj


def _rendered_all() -> list[dict]:
    return [o for o in objects(run_config(dev_config(**TWO_TEAMS))).values() if o["kind"].startswith("ValidatingAdmissionPolicy")]


def _policy(name: str, kind: str = "ValidatingAdmissionPolicy") -> dict:
    return next(o for o in _rendered_all() if o["kind"] == kind and o["metadata"]["name"] == name)


def test_teams_get_the_policy_bound_to_every_team_namespace_denying():
    policy, binding = _policy(admission.POLICY_NAME), _policy(admission.POLICY_NAME, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["trainjobs"] and rule["operations"] == ["CREATE"] and policy["spec"]["failurePolicy"] == "Fail"


def test_every_check_covers_both_trainer_shapes_and_names_its_field():
    validations = admission.trainjob_policy(["gpu-pool"], instance_types=["g5.xlarge"])["spec"]["validations"]
    checks = admission._pod_checks(["gpu-pool"], ["g5.xlarge"])
    pod_validations = validations[: 2 * len(checks)]
    for (expression, why), patch, override in zip(checks, pod_validations[::2], pod_validations[1::2], strict=True):
        assert expression in patch["expression"] and "runtimePatches" in patch["expression"]
        assert expression in override["expression"] and "podTemplateOverrides" in override["expression"]
        field = why.split(":", 1)[0]
        assert patch["message"].startswith("spec.runtimePatches[]") and patch["message"].endswith(why) and field
        assert override["message"] == f"spec.podTemplateOverrides[].spec.{why}"


def test_the_pool_check_lists_exactly_the_gpu_pools():
    policy = admission.trainjob_policy(["gpu-pool", "gpu-efa-32nc"], instance_types=["g5.xlarge"])
    text = str(policy)
    assert "['gpu-pool', 'gpu-efa-32nc']" in text
    assert "system" not in str([v["expression"] for v in policy["spec"]["validations"]])


def test_no_policy_without_teams():
    assert not [o for o in objects(run_config(dev_config())).values() if o["kind"].startswith("ValidatingAdmissionPolicy")]


def test_the_configmap_policy_is_bound_to_team_namespaces_for_team_principals_only():
    policy = _policy(admission.CONFIGMAP_POLICY_NAME)
    binding = _policy(admission.CONFIGMAP_POLICY_NAME, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == admission.CONFIGMAP_POLICY_NAME and binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["configmaps"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    # only requests of a team's group: the platform (and the cluster CA publisher) keep theirs
    assert f"'{tn.team_group('')}'" in policy["spec"]["matchConditions"][0]["expression"]
    assert tn.team_group("vision").startswith(tn.team_group(""))
    check = policy["spec"]["validations"][0]["expression"]
    assert f"startsWith('{admission.CODE_CONFIGMAP_PREFIX}')" in check and TEAM_LABEL in check


def test_code_configmaps_are_named_with_the_prefix_the_policy_allows():
    assert tj.code_configmap_name({"train.py": "print(1)"}).startswith(admission.CODE_CONFIGMAP_PREFIX)
    assert not platform_facts.CONFIGMAP.startswith(admission.CODE_CONFIGMAP_PREFIX)


def test_instance_types_a_team_may_select_are_exactly_the_gpu_pools_never_a_system_groups():
    run = run_config(dev_config(**TWO_TEAMS))
    pools = {v for o in objects(run).values() if o["kind"] == "NodePool" for r in o["spec"]["template"]["spec"]["requirements"] if r["key"] == admission.INSTANCE_TYPE_LABEL for v in r["values"]}
    system = {r.inputs["instanceTypes"][0] for r in run.by_type("eks:index:ManagedNodeGroup")}
    expression = next(v["expression"] for v in _policy(admission.POLICY_NAME)["spec"]["validations"] if f"ps.nodeSelector['{admission.INSTANCE_TYPE_LABEL}'] in" in v["expression"])
    allowed = set(re.findall(r"'([a-z0-9]+\.[a-z0-9]+)'", expression.split(f"ps.nodeSelector['{admission.INSTANCE_TYPE_LABEL}'] in", 1)[1]))
    assert pools and system and allowed == pools
    assert not allowed & system


def test_with_kueue_a_teams_job_must_be_in_its_own_queue_suspended_with_a_platform_priority():
    messages = {v["message"].split(":", 1)[0]: v["expression"] for v in _policy(admission.POLICY_NAME)["spec"]["validations"]}
    assert f"{tn.QUEUE_LABEL}'] == '{tn.LOCAL_QUEUE}'" in messages[f"metadata.labels.{tn.QUEUE_LABEL}"]
    assert messages["spec.suspend"] == "object.spec.?suspend.orValue(false) == true"
    assert str(list(kq.PRIORITIES)) in messages[f"metadata.labels.{kq.PRIORITY_LABEL}"]
    assert messages["metadata.ownerReferences"] == "object.metadata.?ownerReferences.orValue([]).size() == 0"
    assert "trainer.kubeflow.org/trainjob-controller" in messages["spec.managedBy"]
    assert admission.PRIORITY_LABEL == kq.PRIORITY_LABEL


def test_without_kueue_no_queue_is_required_but_the_owner_and_manager_fences_stay():
    fields = {v["message"].split(":", 1)[0] for v in admission.trainjob_policy(["gpu-pool"], instance_types=["g5.xlarge"])["spec"]["validations"]}
    assert "spec.suspend" not in fields and f"metadata.labels.{tn.QUEUE_LABEL}" not in fields
    assert {"metadata.ownerReferences", "spec.managedBy"} <= fields


@pytest.mark.parametrize("key,reserved", [
    ("kueue.x-k8s.io/queue-name", True), ("kueue.x-k8s.io/managed", True), ("alpha.jobset.sigs.k8s.io/exclusive-topology", True),
    ("jobset.sigs.k8s.io/jobset-name", True), ("trainer.kubeflow.org/trainjob-ancestor-step", True), ("karpenter.sh/do-not-disrupt", True),
    ("kubernetes.io/arch", True), ("node.kubernetes.io/instance-type", True), ("training-platform/team", True), ("k8s.io/x", True),
    ("app", False), ("example.com/owner", False), ("my-training-platform/x", False), ("kubernetes.io.example.com/x", False), ("team", False),
])
def test_reserved_label_keys_are_the_controllers_domains_and_subdomains(key, reserved):
    # RE2 (CEL's matches) and Python's re agree on this pattern: anchors, classes, alternation only
    assert bool(re.search(admission.RESERVED_KEY_RE, key)) is reserved


@pytest.mark.parametrize("sub_path,refused", [("../nlp", True), ("x/../../nlp", True), ("..", True), ("a/..", True), ("run-1/ckpt", False), ("..hidden", False), ("a..b/c", False)])
def test_sub_paths_that_climb_are_recognised(sub_path, refused):
    check = next(c for c, why in admission._pod_checks(["gpu-pool"], ["g5.xlarge"]) if why.startswith("containers[].volumeMounts"))
    found = re.search(r"matches\('([^']+)'\)", check)
    assert found is not None, check
    assert bool(re.search(found.group(1), sub_path)) is refused


def _pod_check_fields() -> set[str]:
    return {why.split(":", 1)[0] for _, why in admission._pod_checks(["gpu-pool"], ["g5.xlarge"])}


def test_patches_may_not_set_nvidia_env_scheduling_gates_pull_secrets_or_a_grace_period():
    assert {"containers[].env", "schedulingGates", "imagePullSecrets", "terminationGracePeriodSeconds"} <= _pod_check_fields()
    checks = {why.split(":", 1)[0]: check for check, why in admission._pod_checks(["gpu-pool"], ["g5.xlarge"])}
    env = checks["containers[].env"]
    assert "ps.?containers" in env and "ps.?initContainers" in env and f"startsWith('{admission.NVIDIA_ENV_PREFIX}')" in env
    for field in ("schedulingGates", "imagePullSecrets", "terminationGracePeriodSeconds"):
        assert checks[field] == f"!ps.?{field}.hasValue()"
    # the grace period is a field Kueue drops anyway: the policy refuses what the builders never emit
    assert any(f.endswith(".terminationGracePeriodSeconds") for f in trainer_api.KUEUE_DROPPED_FIELDS)


def test_the_trainer_env_and_the_initializer_env_are_checked_naming_the_field():
    messages = {v["message"].split(":", 1)[0]: v["expression"] for v in admission.trainjob_policy(["gpu-pool"], instance_types=["g5.xlarge"])["spec"]["validations"]}
    assert f"object.spec.?trainer.?env.orValue([]).all(e, !e.name.startsWith('{admission.NVIDIA_ENV_PREFIX}'))" == messages["spec.trainer.env"]
    for kind in ("dataset", "model"):
        assert f"object.spec.?initializer.?{kind}.?env" in messages[f"spec.initializer.{kind}.env"]
        assert str(list(admission.INITIALIZER_ENV)) in messages[f"spec.initializer.{kind}.env"]
    assert admission.NVIDIA_ENV_PREFIX == "NVIDIA_" and "CUDA_VISIBLE_DEVICES".startswith(admission.NVIDIA_ENV_PREFIX) is False


def test_patches_for_the_jobs_on_the_system_nodes_may_carry_no_pod_spec_in_either_shape():
    validations = admission.trainjob_policy(["gpu-pool"], instance_types=["g5.xlarge"])["spec"]["validations"]
    system = [v for v in validations if admission.SYSTEM_JOBS_WHY in v["message"]]
    assert len(system) == 2
    patch, override = system
    assert "runtimePatches" in patch["expression"] and "!j.?template.?spec.?template.?spec.hasValue()" in patch["expression"]
    assert "podTemplateOverrides" in override["expression"] and "!o.?spec.hasValue()" in override["expression"]
    for v in system:
        assert str(list(admission.SYSTEM_NODE_JOBS)) in v["expression"]


def test_the_system_node_jobs_are_exactly_the_runtime_jobs_placed_on_the_system_nodes():
    runtimes = [o for o in objects(run_config(dev_config(**TWO_TEAMS))).values() if o["kind"] == "ClusterTrainingRuntime"]
    on_system = {j["name"] for r in runtimes for j in r["spec"]["template"]["spec"]["replicatedJobs"]
                 if j["template"]["spec"]["template"]["spec"].get("nodeSelector", {}).get(NODE_ROLE_LABEL) == "system"}
    assert on_system == set(admission.SYSTEM_NODE_JOBS)


def _envs(obj, path: str = "") -> list[tuple[str, str]]:
    """(path, env name) of every env entry anywhere in ``obj``."""
    found = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "env" and isinstance(value, list):
                found += [(f"{path}.env", e["name"]) for e in value]
            else:
                found += _envs(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for item in obj:
            found += _envs(item, f"{path}[]")
    return found


def _platform_trainjobs(tmp_path) -> list[dict]:
    """The TrainJobs the platform itself renders (the teams stack's) and trainctl builds, both Trainer shapes."""
    from trainctl import code
    from trainctl import objects as trainctl_objects

    jobs = [o for o in objects(run_config(dev_config(**TWO_TEAMS))).values() if o["kind"] == "TrainJob"]
    (tmp_path / "train.py").write_text("print(1)\n")
    bundle = code.collect(tmp_path)
    for version in ("v2.1.0", "v2.3.0"):
        req = trainctl_objects.Request(namespace="vision", nodes=2, command=["python", "train.py"], name="t", runtime_name="torch", trainer_version=version)
        jobs.append(trainctl_objects.build(req, bundle)[1])
    return jobs


def test_the_platforms_own_trainjobs_pass_the_new_checks(tmp_path):
    jobs = _platform_trainjobs(tmp_path)
    assert any("initializer" in j["spec"] for j in jobs) and any("podTemplateOverrides" in j["spec"] for j in jobs)
    for job in jobs:
        name = job["metadata"]["name"]
        assert not [e for e in _envs(job["spec"]) if e[1].startswith(admission.NVIDIA_ENV_PREFIX)], name
        for kind, source in job["spec"].get("initializer", {}).items():
            assert {e["name"] for e in source.get("env", [])} <= set(admission.INITIALIZER_ENV), (name, kind)
        for patch in job["spec"].get("runtimePatches", []):
            for j in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                ps = j.get("template", {}).get("spec", {}).get("template", {}).get("spec")
                assert j["name"] not in admission.SYSTEM_NODE_JOBS or ps is None, (name, j)
                assert not {"schedulingGates", "imagePullSecrets", "terminationGracePeriodSeconds"} & set(ps or {}), (name, j)
        for override in job["spec"].get("podTemplateOverrides", []):
            if {t["name"] for t in override["targetJobs"]} & set(admission.SYSTEM_NODE_JOBS):
                assert "spec" not in override, (name, override)
            assert not {"schedulingGates", "imagePullSecrets"} & set(override.get("spec", {})), (name, override)

