"""The team TrainJob admission policy as rendered (manifests/admission.py). Its CEL is evaluated by a real
API server in tests/e2e/test_isolation.py (hostile and normal TrainJobs of both Trainer shapes)."""

from __future__ import annotations

from manifests import admission
from manifests.tenants import TEAM_LABEL
from tests.conftest import dev_config, objects, run_config
from tests.test_tenants import TWO_TEAMS


def _rendered() -> dict[str, dict]:
    return {o["kind"]: o for o in objects(run_config(dev_config(**TWO_TEAMS))).values() if o["kind"].startswith("ValidatingAdmissionPolicy")}


def test_teams_get_the_policy_bound_to_every_team_namespace_denying():
    found = _rendered()
    policy, binding = found["ValidatingAdmissionPolicy"], found["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]}
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["trainjobs"] and rule["operations"] == ["CREATE"] and policy["spec"]["failurePolicy"] == "Fail"


def test_every_check_covers_both_trainer_shapes_and_names_its_field():
    validations = admission.trainjob_policy(["gpu-pool"])["spec"]["validations"]
    checks = admission._pod_checks(["gpu-pool"])
    assert len(validations) == 2 * len(checks)
    for (expression, why), patch, override in zip(checks, validations[::2], validations[1::2], strict=True):
        assert expression in patch["expression"] and "runtimePatches" in patch["expression"]
        assert expression in override["expression"] and "podTemplateOverrides" in override["expression"]
        field = why.split(":", 1)[0]
        assert patch["message"].startswith("spec.runtimePatches[]") and patch["message"].endswith(why) and field
        assert override["message"] == f"spec.podTemplateOverrides[].spec.{why}"


def test_the_pool_check_lists_exactly_the_gpu_pools():
    policy = admission.trainjob_policy(["gpu-pool", "gpu-efa-32nc"])
    text = str(policy)
    assert "['gpu-pool', 'gpu-efa-32nc']" in text
    assert "system" not in str([v["expression"] for v in policy["spec"]["validations"]])


def test_no_policy_without_teams():
    assert not [o for o in objects(run_config(dev_config())).values() if o["kind"].startswith("ValidatingAdmissionPolicy")]
