"""The AWS Load Balancer Controller's chart (the portal's, ``portal.enabled`` on a self-managed GPU
pool) on a local control plane, as tests/e2e/test_charts.py judges the other charts: the chart at
the pinned version (3.5.0, from the eks-charts module: versions.EKS_CHARTS_MODULE says why) rendered
by the Helm SDK with the stack's values (an unknown key refused), its objects applied next to the
portal's, its Deployment on system nodes, its RBAC giving what the controller's code asks (access
reviews), and the portal's Ingresses accepted by the API server with the chart's IngressClass and
IngressClassParams in place.

What this cannot show: the controller itself needs AWS (it calls ELBv2 and EC2 to make the ALB), so
here its pods run no container (kwok), and its webhooks (the ``vingress.elbv2.k8s.aws`` validation
of Ingresses among them, failurePolicy Fail by default) are judged by a dry run only: registered
with no server behind them they would refuse every Ingress (chart_apply.DRY_RUN_ONLY)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.portal_helpers import INSTANCE, STACK, portal_stack
from tools.cluster import chart_apply, charts
from tools.cluster.apply import dry_create_renamed

RELEASE = "aws-load-balancer-controller"


@pytest.fixture(scope="module")
def alb(clusters):
    up = clusters.get(STACK, instance=INSTANCE, stack_config=portal_stack())
    client = up.client()
    release = next(r for r in up.plan.releases if r.name == RELEASE)
    rendered = charts.template(release, up.plan, api_versions=chart_apply.served_api_versions(client))
    applied = chart_apply.apply_release(client, rendered)
    yield up, release, rendered, applied
    clusters.release(STACK, INSTANCE)


def test_the_stacks_values_render_the_pinned_chart_and_an_unknown_key_is_refused(alb):
    up, release, rendered, _ = alb
    assert (rendered.source.module, rendered.source.chart_version) == ("github.com/aws/eks-charts", "3.5.0")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered.manifests}
    assert {("IngressClass", "alb"), ("IngressClassParams", "alb"), ("Deployment", RELEASE)} <= kinds  # the chart's List flattened, as Helm does
    deployment = next(o for o in rendered.manifests if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "public.ecr.aws/eks/aws-load-balancer-controller:v3.5.0"
    assert pod["serviceAccountName"] == "aws-load-balancer-controller" and pod["nodeSelector"] == {"training-platform/node-role": "system"}
    args = pod["containers"][0]["args"]
    assert f"--cluster-name={release.values['clusterName']}" in args and f"--aws-vpc-id={release.values['vpcId']}" in args and f"--aws-region={release.values['region']}" in args
    with pytest.raises(charts.ChartError) as err:
        charts.template(release, up.plan, values={**release.values, "vpcID": "vpc-0"})
    assert str(err.value) == f"release {RELEASE}: values key vpcID is unknown to chart aws-load-balancer-controller (not in its values.yaml, read by no template)"


def test_every_object_applies_and_the_webhooks_are_judged_by_a_dry_run(alb):
    up, _, rendered, applied = alb
    assert applied.problems == [], "\n".join(applied.problems)
    assert {o["kind"] for o in applied.objects} >= {"CustomResourceDefinition", "Deployment", "ClusterRole", "IngressClass", "IngressClassParams", "Service", "Secret"}
    assert sorted(lbl.split(" ", 1)[0] for lbl in applied.dry_run) == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    # no webhook on the cluster's Services (values enableServiceMutatorWebhook: false, k8s/portal.py): the pods' one stays,
    # selecting only namespaces labelled for the readiness gate, as the portal's is
    mutating = next(o for o in rendered.manifests if o["kind"] == "MutatingWebhookConfiguration")
    names = {w["name"] for w in mutating["webhooks"]}
    assert "mservice.elbv2.k8s.aws" not in names and "mpod.elbv2.k8s.aws" in names
    mpod = next(w for w in mutating["webhooks"] if w["name"] == "mpod.elbv2.k8s.aws")
    gate = [e for e in mpod["namespaceSelector"]["matchExpressions"] if e["key"] == "elbv2.k8s.aws/pod-readiness-gate-inject"]
    portal_ns = next(o for o in up.plan.objects if o["kind"] == "Namespace" and o["metadata"]["name"] == "platform-portal")
    assert gate and portal_ns["metadata"]["labels"]["elbv2.k8s.aws/pod-readiness-gate-inject"] in gate[0]["values"]
    # the chart validates every Ingress of every namespace, failing closed: its selectors render empty
    # (null: the API server reads them as {}, match all), failurePolicy Fail (webhookConfig.ingressValdationFailurePolicy)
    validating = next(o for o in rendered.manifests if o["kind"] == "ValidatingWebhookConfiguration")
    vingress = next(w for w in validating["webhooks"] if w["name"] == "vingress.elbv2.k8s.aws")
    assert vingress["failurePolicy"] == "Fail" and not vingress.get("objectSelector") and not vingress.get("namespaceSelector")
    ingress_class = up.client().get("networking.k8s.io/v1", "IngressClass", "alb")
    # the controller name the controller serves (kubernetes-sigs/aws-load-balancer-controller v3.5.0 pkg/ingress/class_loader.go IngressClassControllerALB)
    assert ingress_class["spec"]["controller"] == "ingress.k8s.aws/alb"
    # the chart links its IngressClassParams only when given a spec (ingressclass.yaml; the stack gives none)
    assert "parameters" not in ingress_class["spec"] and up.client().get("elbv2.k8s.aws/v1beta1", "IngressClassParams", "alb")


def test_the_controller_runs_on_system_nodes(alb):
    up, _, _, applied = alb
    client = up.client()
    (deployment,) = applied.workloads("Deployment")
    problems = wait_for("the ALB controller's pods Running", lambda: (lambda got: None if got is None else (got,))(chart_apply.deployment_placement(client, deployment, up.plan)), up, timeout=120)[0]
    assert problems == [], "\n".join(problems)


def test_its_service_account_may_do_what_the_controllers_code_asks_and_no_more_than_the_chart_gives(alb):
    up, _, rendered, applied = alb
    client = up.client()
    (deployment,) = applied.workloads("Deployment")
    assert chart_apply.rbac_gaps(client, deployment, up.plan, rendered.manifests) == []
    user = "system:serviceaccount:kube-system:aws-load-balancer-controller"

    def may(verb: str, resource: str, group: str = "", namespace: str = "", name: str = "") -> bool:
        attrs = {"verb": verb, "resource": resource, "group": group, **({"namespace": namespace} if namespace else {}), **({"name": name} if name else {})}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"user": user, "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system"], "resourceAttributes": attrs}}
        return bool((client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review).get("status") or {}).get("allowed"))

    # leader election (config/rbac/leader_election_role.yaml at v3.5.0: leases, aws-load-balancer-controller-leader)
    assert may("create", "leases", "coordination.k8s.io", "kube-system")
    assert may("update", "leases", "coordination.k8s.io", "kube-system", "aws-load-balancer-controller-leader")
    # and nothing of the teams': their pods' secrets, their jobs
    assert not may("list", "secrets", namespace="vision") and not may("create", "pods", namespace="vision") and not may("delete", "trainjobs", "trainer.kubeflow.org", "vision")
    # the Ingresses' OIDC client Secret, which the controller reads uncached (v3.5.0 pkg/ingress/model_build_actions.go,
    # pkg/config/runtime_config.go): the stack's Role (k8s/builders/portal.py), as the chart grants no Secrets (allowAllSecrets false)
    for verb in ("get", "list", "watch"):
        assert may(verb, "secrets", namespace="platform-portal", name="portal-oidc"), verb
    assert not may("get", "secrets", namespace="platform-portal", name="portal-other") and not may("list", "secrets", namespace="platform-portal")
    assert not may("get", "secrets", namespace="kube-system", name="portal-oidc") and not may("update", "secrets", namespace="platform-portal", name="portal-oidc")


def test_the_portals_ingresses_are_accepted_with_the_charts_objects_in_place(alb):
    up, _, _, _ = alb
    client = up.client()
    ingresses = [o for o in up.plan.objects if o["kind"] == "Ingress"]
    assert ingresses and {i["spec"]["ingressClassName"] for i in ingresses} == {"alb"}  # the chart's IngressClass (values ingressClass: alb)
    for ingress in ingresses:
        assert client.get("networking.k8s.io/v1", "Ingress", ingress["metadata"]["name"], ingress["metadata"]["namespace"])  # applied with the stack
        assert dry_create_renamed(client, ingress, "-again") == []  # and a new one now, with the IngressClass and its params in place
