"""A team's AWS identity on the real API server, Kueue, Trainer v2.3.0 and JobSet (the teams stack,
whose ``vision`` team lists S3 buckets): a job a member submits as trainctl and the portal build it
(the published facts applied) runs its pods as the team's service account, which Kueue's admission
keeps; the service account may do nothing in the Kubernetes API; a job naming any other service
account is refused by the admission policy; only the team with an identity reaches the Pod Identity
agent. (The IAM role and the association are AWS resources: tests/test_team_identity.py checks them
in the rendered plan; a local cluster has no Pod Identity webhook to inject credentials.)"""

from __future__ import annotations

import copy
import json

import pytest

from k8s.builders import platform_facts, trainer_api
from k8s.builders.tenants import POD_IDENTITY_AGENT_CIDRS, TEAM_SERVICE_ACCOUNT
from tests.e2e.conftest import wait_for
from tests.e2e.test_teams import STACK, TRAINJOB, _torch_runtime, as_team, submit, submit_code
from tools.cluster.client import ApiError
from trainctl import code, objects

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


@pytest.fixture(scope="module")
def teams(clusters):
    up = clusters.get(STACK)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    return up, {t: as_team(up, access, t) for t in ("vision", "nlp")}


def _facts(client, ns: str) -> dict:
    return json.loads(client.get("v1", "ConfigMap", platform_facts.CONFIGMAP, ns)["data"][platform_facts.KEY])


def _job(up, client, tmp_path, name: str) -> tuple[dict, dict]:
    """The job as trainctl and the portal build it: the namespace's published facts applied."""
    (tmp_path / "train.py").write_text("print('hello')\n")
    req = objects.Request(namespace="vision", nodes=1, command=["python", "train.py"], name=name, runtime_name=_torch_runtime(up))
    req = objects.with_facts(req, _facts(client, "vision"), instance_type_given=False)
    return objects.build(req, code.collect(tmp_path))


def test_a_team_jobs_pods_run_as_the_teams_service_account_after_kueue_admits_it(teams, tmp_path):
    up, members = teams
    vision, admin = members["vision"], up.client()
    configmap, job = _job(up, vision, tmp_path, "aws-identity")
    assert trainer_api.read_pod_customization(job["spec"])["serviceAccountName"] == TEAM_SERVICE_ACCOUNT
    submit(vision, configmap, job)
    try:
        def node_pods():
            pods = admin.list("v1", "Pod", "vision", label_selector=f"{JOBSET_LABEL}=aws-identity,jobset.sigs.k8s.io/replicatedjob-name={trainer_api.TRAINER_JOB}")
            return pods or None

        pods = wait_for("aws-identity's node pods", node_pods, up, timeout=300)
        assert {p["spec"]["serviceAccountName"] for p in pods} == {TEAM_SERVICE_ACCOUNT}
        assert all(p["spec"].get("automountServiceAccountToken") is False for p in pods)  # the runtime's setting stands
        stored = admin.get(*TRAINJOB, "aws-identity", "vision")
        assert stored["spec"].get("suspend") is False  # admitted by Kueue, and its typed update kept the field
        assert trainer_api.read_pod_customization(stored["spec"])["serviceAccountName"] == TEAM_SERVICE_ACCOUNT
    finally:
        admin.delete(*TRAINJOB, "aws-identity", "vision")


def test_the_teams_service_account_exists_in_every_team_namespace_and_may_do_nothing(teams):
    up, _ = teams
    admin = up.client()
    for ns in ("vision", "nlp"):
        sa = admin.get("v1", "ServiceAccount", TEAM_SERVICE_ACCOUNT, ns)
        assert sa["automountServiceAccountToken"] is False
        as_sa = admin.impersonate(f"system:serviceaccount:{ns}:{TEAM_SERVICE_ACCOUNT}", ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"])
        for kind, api in (("Pod", "v1"), ("Secret", "v1"), ("ConfigMap", "v1"), ("TrainJob", TRAINJOB[0])):
            with pytest.raises(ApiError) as err:
                as_sa.list(api, kind, ns)
            assert err.value.status == 403, (ns, kind)


def test_a_job_naming_another_service_account_is_refused_the_teams_and_default_pass(teams, tmp_path):
    up, members = teams
    vision = members["vision"]
    configmap, job = _job(up, vision, tmp_path, "sa-choice")
    submit_code(vision, configmap)
    for allowed in (TEAM_SERVICE_ACCOUNT, "default"):
        ok = copy.deepcopy(job)
        trainer_api.read_pod_customization(ok["spec"])["serviceAccountName"] = allowed
        vision.create(ok, dry_run=True)
    for foreign in ("builder", "kueue-controller-manager", "kube-proxy"):
        bad = copy.deepcopy(job)
        trainer_api.read_pod_customization(bad["spec"])["serviceAccountName"] = foreign
        with pytest.raises(ApiError) as err:
            vision.create(bad, dry_run=True)
        message = str(err.value)
        assert "\n" not in message and "ValidatingAdmissionPolicy" in message
        assert f"serviceAccountName: a team's job runs as its namespace's {TEAM_SERVICE_ACCOUNT} or default service account" in message, message


def test_only_the_team_with_an_identity_reaches_the_pod_identity_agent(teams):
    up, _ = teams
    admin = up.client()

    def agent_rules(ns: str) -> list[dict]:
        egress = admin.get("networking.k8s.io/v1", "NetworkPolicy", "egress", ns)["spec"]["egress"]
        return [r for r in egress if any(p.get("ipBlock", {}).get("cidr") in POD_IDENTITY_AGENT_CIDRS for p in r["to"])]

    (rule,) = agent_rules("vision")  # stored as sent (the API server took the IPv6 block too)
    assert rule["ports"] == [{"protocol": "TCP", "port": 80}]
    assert agent_rules("nlp") == []
