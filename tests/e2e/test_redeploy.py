"""A second render applied over the first the way `pulumi up` would: a runtime change
(trainer.maxRestarts, part of the immutable failure policy) goes through without a 422."""

from __future__ import annotations

from tests.conftest import dev_config, run_config
from tests.e2e.conftest import wait_for
from tools.cluster.apply import redeploy
from tools.cluster.plan import stack_plan


def test_a_changed_runtime_applies_as_pulumi_would(clusters):
    up = clusters.get("dev", instance="redeploy")
    changed = stack_plan(run_config(dev_config(trainer={"maxRestarts": 5})), "us-west-2")
    old_runtimes = {o["metadata"]["name"] for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime"}
    new_runtimes = {o["metadata"]["name"] for o in changed.objects if o["kind"] == "ClusterTrainingRuntime"}
    assert old_runtimes != new_runtimes  # named by a hash of their immutable content
    outcome = redeploy(up.client(), up.plan, changed)
    assert outcome.problems == []
    client = up.client()
    for name in new_runtimes:
        runtime = client.get("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", name)
        assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 5
    # the jobs were replaced onto the new runtimes, and the old runtimes go once nothing uses them
    for job in (o for o in changed.objects if o["kind"] == "TrainJob"):
        live = client.get("trainer.kubeflow.org/v1alpha1", "TrainJob", job["metadata"]["name"], job["metadata"]["namespace"])
        assert live["spec"]["runtimeRef"]["name"] in new_runtimes
    wait_for("the old runtimes deleted", lambda: all(client.get_or_none("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", n) is None for n in old_runtimes - new_runtimes), up, timeout=90)


def test_an_in_place_change_to_an_immutable_field_is_the_api_servers_422(clusters):
    """What Pulumi would hit if a runtime were not named by its content: the CRD's rule refuses it."""
    up = clusters.get("dev", instance="redeploy")
    client = up.client()
    runtime = next(o for o in up.plan.objects if o["kind"] == "ClusterTrainingRuntime")
    live = client.get_or_none(runtime["apiVersion"], runtime["kind"], runtime["metadata"]["name"])
    if live is None:  # the first test replaced it: use a current one
        runtime = client.list(runtime["apiVersion"], runtime["kind"])[0]
        runtime = {k: runtime[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": runtime["metadata"]["name"]}}
    mutated = {**runtime, "spec": {**runtime["spec"], "template": {**runtime["spec"]["template"], "spec": {**runtime["spec"]["template"]["spec"], "failurePolicy": {"maxRestarts": 42}}}}}
    from tools.cluster.client import ApiError

    try:
        client.apply(mutated)
    except ApiError as err:
        assert err.status == 422 and "immutable" in str(err).lower(), err
    else:
        raise AssertionError("the API server accepted an in-place change of an immutable failure policy")
