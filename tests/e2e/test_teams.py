"""Teams on the real API server, acting as each team's principal through impersonation (user = the
principal's ARN, groups = its access entry's Kubernetes groups, as EKS maps them): what the
rendered RBAC lets a team do, and Kueue holding a job that exceeds the team's quota."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import wait_for
from tools.cluster.client import ApiError
from trainctl import code, objects

STACK = "teams"
TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")


@pytest.fixture(scope="module")
def teams(clusters):
    up = clusters.get(STACK)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    assert set(access) == {"vision", "nlp"}
    return up, access


def as_team(up, access, team):
    a = access[team]
    return up.client().impersonate(a.principal, list(a.groups))


def team_job(tmp_path, namespace: str, *, nodes: int = 1, instance_type: str = "g5.xlarge", name: str = "e2e-job", runtime_name: str) -> tuple[dict, dict]:
    (tmp_path / "train.py").write_text("print('hello')\n")
    req = objects.Request(namespace=namespace, nodes=nodes, command=["python", "train.py"], instance_type=instance_type, name=name, runtime_name=runtime_name)
    return objects.build(req, code.collect(tmp_path))


def submit_code(client, configmap: dict) -> None:
    """The code ConfigMap (named by its content: one may exist already)."""
    try:
        client.create(configmap)
    except ApiError as err:
        if err.status != 409:
            raise


def submit(client, configmap: dict, job: dict) -> None:
    """As trainctl submits: the code ConfigMap, then the job."""
    submit_code(client, configmap)
    client.create(job)


def _torch_runtime(up) -> str:
    return next(o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime" and o["metadata"]["labels"].get("training-platform/runtime") == "torch-distributed-gpu")


def _status(fn) -> int:
    try:
        fn()
    except ApiError as err:
        return err.status
    return 200


def test_a_team_creates_trainjobs_in_its_namespace_only(teams, tmp_path):
    up, access = teams
    vision = as_team(up, access, "vision")
    configmap, job = team_job(tmp_path, "vision", name="vision-own", runtime_name=_torch_runtime(up))
    submit(vision, configmap, job)
    assert vision.get(*TRAINJOB, "vision-own", "vision")["metadata"]["name"] == "vision-own"
    # the same job in the other team's namespace is refused by RBAC
    _, other = team_job(tmp_path, "nlp", name="vision-intrudes", runtime_name=_torch_runtime(up))
    assert _status(lambda: vision.create(other)) == 403


@pytest.mark.parametrize("team,other", [("vision", "nlp"), ("nlp", "vision")])
def test_a_team_reads_no_secrets_and_no_other_teams_pods(teams, team, other):
    up, access = teams
    client = as_team(up, access, team)
    assert _status(lambda: client.list("v1", "Secret", team)) == 403
    assert _status(lambda: client.list("v1", "Pod", other)) == 403
    assert _status(lambda: client.list("v1", "Pod", team)) == 200  # its own pods it may read
    assert _status(lambda: client.list("v1", "Secret", "training")) == 403


def test_a_job_over_the_team_quota_stays_pending_with_kueues_reason(teams, tmp_path):
    """A team borrows idle GPUs of the cohort beyond its quota (the ClusterQueues have no borrowing
    limit), so a job is held only when it exceeds its quota and all the cohort can lend: 36 GPUs
    against nlp's 8 in a cohort of 32."""
    up, access = teams
    nlp = as_team(up, access, "nlp")
    configmap, job = team_job(tmp_path, "nlp", nodes=9, instance_type="g5.12xlarge", name="too-big", runtime_name=_torch_runtime(up))  # 36 GPUs
    submit(nlp, configmap, job)
    admin = up.client()

    def pending():
        for w in admin.list("kueue.x-k8s.io/v1beta2", "Workload", "nlp"):
            if any(r["name"] == "too-big" for r in w["metadata"].get("ownerReferences", [])):
                conds = {c["type"]: c for c in (w.get("status") or {}).get("conditions") or []}
                reserved = conds.get("QuotaReserved")
                if reserved and reserved["status"] == "False" and "nvidia.com/gpu" in reserved.get("message", ""):
                    return reserved
        return None

    reserved = wait_for("the over-quota Workload's QuotaReserved=False", pending, up, timeout=60)
    assert reserved["reason"] == "Pending"
    assert "insufficient quota for nvidia.com/gpu in flavor gpu-pool" in reserved["message"], reserved["message"]
    assert admin.get(*TRAINJOB, "too-big", "nlp")["spec"].get("suspend") is True
    assert admin.list("v1", "Pod", "nlp", label_selector="jobset.sigs.k8s.io/jobset-name=too-big") == []
