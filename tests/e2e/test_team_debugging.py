"""Debugging as a team member on the real API server (the teams stack): what the team Role lets a
member read and exec into, in their namespace only, and ``trainctl status`` run with a member's own
credentials (a client certificate of the team's group, as EKS maps an access entry) naming why Kueue
holds a job: the Workload's reason and message with the numbers, its priority and its place in the
LocalQueue and its ClusterQueue, from Kueue's visibility API (the manager's own server, reached
through the API server's aggregation layer: tools/cluster/components.py), which authorizes each
caller through the API server (delegated SubjectAccessReview against the team Role)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from k8s.builders.tenants import team_group
from tests.e2e.conftest import require_kueue_visibility, trainctl, wait_for
from tests.e2e.test_teams import _status, _torch_runtime, as_team, submit, team_job
from tools.cluster import pki

STACK = "teams"


@pytest.fixture(scope="module")
def teams(clusters):
    up = clusters.get(STACK)
    access = {a.groups[0].rsplit(":", 1)[-1]: a for a in up.plan.team_access()}
    return up, access


def member_kubeconfig(up, tmp_path, team: str) -> str:
    """A kubeconfig of a member of ``team``: a client certificate signed by the cluster's CA with the
    team's group as its organization (the API server's x509 authenticator: O = groups, CN = user)."""
    d = up.dir / "pki"
    name = f"{team}-member"
    pki._sign(d, name, f"/O={team_group(team)}/CN={name}", client=True)
    kc = yaml.safe_load(pki.kubeconfig(d, up.server, namespace=team))
    import base64

    kc["users"][0]["user"] = {"client-certificate-data": base64.b64encode((d / f"{name}.crt").read_bytes()).decode(),
                              "client-key-data": base64.b64encode((d / f"{name}.key").read_bytes()).decode()}
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    path.chmod(0o600)
    return str(path)


def _may(client, verb: str, resource: str, ns: str, group: str = "", subresource: str = "") -> bool:
    review = client.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                            "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource, "subresource": subresource, "namespace": ns}}})
    return bool(review["status"].get("allowed"))


@pytest.mark.parametrize("team,other", [("vision", "nlp"), ("nlp", "vision")])
def test_a_member_execs_and_reads_jobsets_jobs_workloads_in_their_namespace_only(teams, team, other):
    up, access = teams
    me = as_team(up, access, team)
    # kubectl exec: POST (create) and the WebSocket GET (get); 1.35+ checks create for the GET too
    for verb in ("create", "get"):
        assert _may(me, verb, "pods", team, subresource="exec"), verb
        assert not _may(me, verb, "pods", other, subresource="exec"), verb
    assert _may(me, "get", "localqueues", team, group="visibility.kueue.x-k8s.io", subresource="pendingworkloads")
    assert not _may(me, "get", "localqueues", other, group="visibility.kueue.x-k8s.io", subresource="pendingworkloads")
    for api_version, kind in (("jobset.x-k8s.io/v1alpha2", "JobSet"), ("batch/v1", "Job"), ("kueue.x-k8s.io/v1beta2", "Workload"), ("kueue.x-k8s.io/v1beta2", "LocalQueue"), ("v1", "ResourceQuota")):
        assert _status(lambda: me.list(api_version, kind, team)) == 200, kind  # noqa: B023
        assert _status(lambda: me.list(api_version, kind, other)) == 403, kind  # noqa: B023
    # read-only: no JobSet or Job of their own (they would bypass the TrainJob admission policy)
    for verb in ("create", "patch", "update", "delete"):
        assert not _may(me, verb, "jobsets", team, group="jobset.x-k8s.io"), verb
        assert not _may(me, verb, "jobs", team, group="batch"), verb


def test_trainctl_status_as_a_member_names_why_a_job_waits_and_where(teams, tmp_path, capsys):
    """Two jobs of 36 GPUs each against nlp's 8 in a cohort of 32: Kueue holds both; the second's
    place has the first ahead of it."""
    up, access = teams
    require_kueue_visibility(up)
    nlp = as_team(up, access, "nlp")
    names = ("waits-first", "waits-second")
    for name in names:
        configmap, job = team_job(tmp_path, "nlp", nodes=9, instance_type="g5.12xlarge", name=name, runtime_name=_torch_runtime(up))
        submit(nlp, configmap, job)
        time.sleep(1.1)  # creation timestamps are whole seconds: the estimate breaks a tie by uid, Kueue by finer times
    kubeconfig = member_kubeconfig(up, tmp_path, "nlp")

    seen: dict[str, dict] = {}

    def status(name: str) -> dict:
        rc, out, err = trainctl(capsys, up, "status", "--kubeconfig", kubeconfig, name, "-o", "json")
        assert rc == 0, err
        seen[name] = json.loads(out)
        return seen[name]

    try:
        first = wait_for("the first job held with Kueue's reason", lambda: (r := status(names[0]))["admission"].count("maximum capacity") and r, up, timeout=90)
        # Kueue tries the queue's head: the second, behind it, has no QuotaReserved condition yet, and its place says why
        second = wait_for("the second job placed behind the first", lambda: "ahead: waits-first" in ((r := status(names[1])).get("queuePosition") or "") and r, up, timeout=60)
    except AssertionError as err:
        raise AssertionError(f"{err}; last reports: {seen}") from None
    try:
        assert first["admission"].startswith("queued in default: Pending: couldn't assign flavors to pod set node: ")
        assert "insufficient quota for nvidia.com/gpu in flavor gpu-pool, previously considered podsets requests (0) + current podset request (36) > maximum capacity (32)" in first["admission"]
        # Kueue's own figures: the visibility API answered (an estimate would say "estimated" and have no ClusterQueue place)
        assert first["queuePosition"] == "1 in LocalQueue default, 1 in its ClusterQueue"
        assert second["queuePosition"] == "2 in LocalQueue default, 2 in its ClusterQueue; ahead: waits-first"
        for report in (first, second):
            assert report["phase"] == "Queued"
            assert report["priority"]  # the team's WorkloadPriorityClass and its value
            assert "notAllowed" not in report  # a member reads all of it
        # the visibility API asks the API server whether the caller may: nlp's list for nlp, not for vision
        pending = "/apis/visibility.kueue.x-k8s.io/{version}/namespaces/nlp/localqueues/default/pendingworkloads"
        for version in ("v1beta1", "v1beta2"):
            items = nlp.request("GET", pending.format(version=version))["items"]
            assert [(i["metadata"]["name"].startswith("trainjob-waits-first"), i["positionInLocalQueue"]) for i in items] == [(True, 0), (False, 1)], items
            assert _status(lambda: as_team(up, access, "vision").request("GET", pending.format(version=version))) == 403  # noqa: B023
        # the table says the same
        rc, out, _ = trainctl(capsys, up, "status", "--kubeconfig", kubeconfig, names[0])
        flat = "".join(c for c in out if c not in " \n│┃")
        assert rc == 0 and "maximumcapacity(32)" in flat and "1inLocalQueuedefault" in flat
        # another team's job: one line, not "none"
        rc, out, err = trainctl(capsys, up, "status", "--kubeconfig", kubeconfig, "-n", "vision", "anything")
        assert rc == 1 and err == "trainctl: error: not allowed: get trainjobs in vision (ask the platform team)\n"
        # diagnose as the member: the pending finding, nothing refused
        rc, out, err = trainctl(capsys, up, "diagnose", "--kubeconfig", kubeconfig, names[0], "-o", "json")
        causes = {f["cause"] for f in json.loads(out)}
        assert rc == 0 and "Kueue: pending" in causes and "evidence you may not read" not in causes, out
    finally:
        for name in names:
            up.client().delete("trainer.kubeflow.org/v1alpha1", "TrainJob", name, "nlp")
