"""The real charts of the stack's Helm releases on the local control plane (tools/cluster/charts.py,
tools/cluster/chart_apply.py): the Trainer (with its JobSet), Kueue and Karpenter charts from their
Go modules at the pinned versions, rendered by the Helm SDK with the stack's values and applied
next to the locally run controllers, which keep doing the work.

* the stack's values have no key the chart does not know, and Helm renders them;
* every object applies and reads back whole (CRDs, webhook configurations and APIServices as a
  server-side dry run: chart_apply.DRY_RUN_ONLY says why);
* each Deployment's pods Running on system nodes (the managed node groups), on an architecture its
  image is built for; each DaemonSet on exactly the node kinds it must cover;
* each controller's service account may do, through the chart's RBAC, what its code's generated
  role asks.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import wait_for
from tools.cluster import chart_apply, charts
from tools.cluster.plan import Release, stack_plan
from tools.cluster.up import PROJECT_DIR, _region
from tools.mock_runtime import run_program

STACKS = ["dev", "teams"]
SHIPPED = ["dev", "prod", "teams", "workshop"]


@pytest.fixture(scope="module", params=STACKS)
def judged(request, clusters):
    up = clusters.get(request.param)
    client = up.client()
    rendered = charts.rendered(up.plan, api_versions=chart_apply.served_api_versions(client))
    applied = [chart_apply.apply_release(client, r) for r in rendered]
    return up, rendered, applied


@pytest.mark.parametrize("stack", SHIPPED)
def test_each_shipped_stacks_values_are_known_to_its_charts_and_render(stack):
    plan = stack_plan(run_program(str(PROJECT_DIR), stack), _region(stack, None))
    rendered = charts.rendered(plan)  # ChartError: one line per unknown key or Helm's refusal
    assert {r.release.name for r in rendered} == {r.name for r in plan.releases} - set(charts.not_rendered(plan))
    assert all(r.manifests for r in rendered)
    # the Trainer manager's image is the release's own (v2.1.0 tags it with the appVersion its release build adds)
    trainer = next(r for r in rendered if r.release.name == "kubeflow-trainer")
    images = [c["image"] for m in trainer.manifests if m["kind"] == "Deployment" for c in m["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
    assert images and all(i.endswith(":v" + trainer.source.chart_version) for i in images), images


def _settled(what: str, judge, up, why) -> list[str]:
    """``judge()``'s problems once it can say (it returns None until then); on a timeout, ``why()``."""
    try:
        return wait_for(what, lambda: (lambda got: None if got is None else (got,))(judge()), up, timeout=120)[0]
    except AssertionError as err:
        raise AssertionError(f"{err}: {why()}") from None


def test_only_charts_without_a_module_are_left_unjudged(judged):
    up, rendered, _ = judged
    assert {r.release.name for r in rendered} >= {"kubeflow-trainer", "karpenter"}
    left = charts.not_rendered(up.plan)
    assert set(left) <= {"nvidia-device-plugin", "aws-efa-k8s-device-plugin", "dcgm-exporter", "kube-prometheus-stack"}, left


def test_every_chart_object_applies_and_reads_back_whole(judged):
    _, rendered, applied = judged
    problems = [p for a in applied for p in a.problems]
    assert problems == [], "\n".join(problems)
    for a in applied:
        assert a.objects, a.release
        # only the kinds that must not replace the local cluster's own are left to a dry run
        assert {lbl.split(" ", 1)[0] for lbl in a.dry_run} <= set(chart_apply.DRY_RUN_ONLY), a.dry_run
    kinds = {o["kind"] for a in applied for o in a.objects}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"} <= kinds


def test_each_deployment_runs_on_system_nodes_of_an_architecture_its_image_has(judged):
    up, _, applied = judged
    client = up.client()
    deployments = [d for a in applied for d in a.workloads("Deployment")]
    # the Trainer's and JobSet's controllers, Karpenter's, and Kueue's where the stack runs it
    assert len(deployments) >= 3
    for d in deployments:
        problems = _settled(f"{d['metadata']['name']}'s pods Running", lambda d=d: chart_apply.deployment_placement(client, d, up.plan), up, lambda d=d: chart_apply.not_running(client, d))
        assert problems == [], "\n".join(problems)
    nodes = {p["spec"]["nodeName"] for d in deployments for p in chart_apply.pods(client, d)}
    assert {client.get("v1", "Node", n)["metadata"]["labels"]["kubernetes.io/arch"] for n in nodes} <= {"amd64", "arm64"}


def test_each_daemonset_covers_exactly_the_nodes_it_must(judged):
    up, _, applied = judged
    client = up.client()
    found = {(a.release, ds["metadata"]["name"]) for a in applied for ds in a.workloads("DaemonSet")}
    # each DaemonSet a rendered chart brings says which node kinds it must cover (none of the
    # charts rendered here has one at the pinned versions; the device plugins' are not rendered)
    assert found == {key for key in chart_apply.DAEMONSET_NODES if key[0] in {a.release for a in applied}}
    for a in applied:
        for ds in a.workloads("DaemonSet"):
            problems = _settled(f"{ds['metadata']['name']} counted", lambda ds=ds, a=a: chart_apply.daemonset_coverage(client, a.release, ds), up, lambda ds=ds: chart_apply.not_running(client, ds))
            assert problems == [], problems


def test_each_controller_may_do_what_its_code_asks_through_the_charts_rbac(judged):
    up, rendered, applied = judged
    client = up.client()
    checked = 0
    for r, a in zip(rendered, applied, strict=True):
        for d in a.workloads("Deployment"):
            assert chart_apply.rbac_gaps(client, d, up.plan, r.manifests) == []
            checked += bool([c for c in d["spec"]["template"]["spec"]["containers"] if (b := chart_apply.image_build(c["image"])) and b.role_file])
    assert checked >= 2 + (up.plan.kueue is not None)  # the Trainer's and JobSet's controllers, and Kueue's


# What Kueue's visibility API server asks of the API server as it authenticates and authorizes a
# caller (kueue v0.19.2 pkg/visibility/server.go: k8s.io/apiserver's delegated RecommendedOptions):
# TokenReviews, SubjectAccessReviews, and the front proxy's CA from kube-system's
# extension-apiserver-authentication ConfigMap (a list and watch with a metadata.name field
# selector: k8s.io/apiserver pkg/authentication/request/headerrequest/requestheader_controller.go and
# pkg/server/dynamiccertificates/configmap_cafile_content.go,
# so asked with the name, as Kubernetes' extension-apiserver-authentication-reader Role grants it).
# Kueue's generated role has none of it: the chart grants it (metrics_auth_role, the auth-reader
# RoleBinding in kube-system).
DELEGATED_AUTH = [
    {"group": "authentication.k8s.io", "resource": "tokenreviews", "verb": "create"},
    {"group": "authorization.k8s.io", "resource": "subjectaccessreviews", "verb": "create"},
    *({"resource": "configmaps", "verb": verb, "namespace": "kube-system", "name": "extension-apiserver-authentication"} for verb in ("get", "list", "watch")),
]


def test_kueues_visibility_server_may_authenticate_and_authorize_its_callers_through_the_charts_rbac(judged):
    """Locally Kueue runs as an administrator, so its visibility API answering team members proves
    the flow but not the chart's grants; this asks the API server for them, as the chart's
    controller service account."""
    up, _, applied = judged
    if up.plan.kueue is None:
        pytest.skip("this stack runs no Kueue")
    kueue = next(d for a in applied for d in a.workloads("Deployment") if "kueue" in d["metadata"]["name"])
    ns, sa = kueue["metadata"]["namespace"], kueue["spec"]["template"]["spec"]["serviceAccountName"]
    assert [attrs for attrs in DELEGATED_AUTH if not chart_apply.service_account_may(up.client(), ns, sa, attrs)] == []


def test_the_rbac_check_sees_a_missing_grant(judged):
    """A service account the chart binds nothing to may do none of it."""
    up, _, applied = judged
    trainer = next(d for a in applied for d in a.workloads("Deployment") if "trainer" in d["metadata"]["name"])
    stranger = {**trainer, "spec": {**trainer["spec"], "template": {**trainer["spec"]["template"], "spec": {**trainer["spec"]["template"]["spec"], "serviceAccountName": "nobody"}}}}
    gaps = chart_apply.rbac_gaps(up.client(), stranger, up.plan)
    assert gaps and all(":nobody may not " in g for g in gaps)


# --- unknown values keys, on the real charts ------------------------------------------------------------

def _release(plan, name: str) -> Release:
    return next(r for r in plan.releases if r.name == name)


@pytest.fixture(scope="module")
def dev_plan():
    return stack_plan(run_program(str(PROJECT_DIR), "dev"), _region("dev", None))


def test_an_unknown_key_in_the_karpenter_values_fails_naming_the_release_and_the_key(dev_plan):
    release = _release(dev_plan, "karpenter")
    wrong = {**release.values, "settings": {**release.values["settings"], "featureGates": {"nodeRepare": True}}}
    with pytest.raises(charts.ChartError) as err:
        charts.template(release, dev_plan, values=wrong)
    assert str(err.value) == "release karpenter: values key settings.featureGates.nodeRepare is unknown to chart karpenter (not in its values.yaml, read by no template)"


def test_an_unknown_key_for_the_trainers_jobset_subchart_fails(dev_plan):
    release = _release(dev_plan, "kubeflow-trainer")
    with pytest.raises(charts.ChartError, match=r"^release kubeflow-trainer: values key jobset\.imag is unknown to chart kubeflow-trainer/charts/jobset "):
        charts.template(release, dev_plan, values={**release.values, "jobset": {"imag": {"tag": "v0"}}})


def test_helms_own_refusal_is_one_line_naming_the_release(dev_plan):
    release = _release(dev_plan, "kubeflow-trainer")
    # a known key of the wrong type: the chart's template fails on it
    with pytest.raises(charts.ChartError, match=r"^release kubeflow-trainer: Helm refuses chart kubeflow-trainer 2\.3\.0 with the stack's values: template: .*webhook\.port[^\n]*$"):
        charts.template(release, dev_plan, values={**release.values, "manager": {"config": {"webhook": "x"}}})


def test_a_value_helm_drops_while_merging_fails(dev_plan):
    release = _release(dev_plan, "karpenter")
    # a string where the chart has a map: Helm keeps its own map and only logs it
    with pytest.raises(charts.ChartError) as err:
        charts.template(release, dev_plan, values={**release.values, "controller": {"resources": "big"}})
    assert str(err.value) == "release karpenter: Helm dropped a value of ours: warning: cannot overwrite table with non table for karpenter.controller.resources (map[])"
