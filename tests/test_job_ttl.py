"""A job's own time to live after it finishes: ``trainctl submit --ttl``, the portal's
``ttl_seconds_after_finished``, carried as an annotation of the TrainJob, held to the stack's
``trainjobs.finishedJobRetentionMax`` (published in the platform's facts) and honoured by the
cleanup CronJob (tests/test_observability.py); checkpoints are never touched by it."""

from __future__ import annotations

import pytest

from config.schema import ConfigError
from config.settings import load_settings
from trainctl import cli, code, objects
from trainctl.portal.submission import JobSpec, Problems, request_of
from workloads.builders import trainjobs as tj


@pytest.mark.parametrize(("text", "seconds"), [("2h", 7200), ("1h30m", 5400), ("45s", 45), ("86400", 86400), ("0", 0)])
def test_ttl_flag_takes_durations_and_seconds(text, seconds):
    assert objects.ttl_flag(text) == (seconds, [])


@pytest.mark.parametrize("text", ["2d", "Never", "-5", "1.5h", "", "٣"])
def test_ttl_flag_refuses_anything_else_in_one_line(text):
    seconds, lines = objects.ttl_flag(text)
    assert seconds is None and len(lines) == 1 and lines[0].startswith("--ttl ") and "allowed: a duration" in lines[0]


def test_the_trainjob_carries_the_ttl_and_a_job_without_one_carries_nothing(proj):
    req = objects.Request(namespace="vision", nodes=1, gpus_per_node=1, command=["python", "train.py"], name="t")
    _, plain = objects.build(req, code.collect(proj))
    assert tj.TTL_ANNOTATION not in (plain["metadata"].get("annotations") or {})
    _, asked = objects.build(objects.Request(**{**req.__dict__, "ttl_seconds": 3600}), code.collect(proj))
    assert asked["metadata"]["annotations"] == {tj.TTL_ANNOTATION: "3600"}


def test_the_platforms_maximum_is_applied_at_submit():
    facts = {"pools": [{"name": "gpu-pool", "instanceTypes": ["g5.xlarge"], "efa": False}], "finishedJobRetention": "168h", "finishedJobRetentionMax": "24h"}
    req = objects.Request(namespace="vision", nodes=1, command=["python", "train.py"], instance_type="g5.xlarge")
    assert objects.with_facts(objects.Request(**{**req.__dict__, "ttl_seconds": 86400}), facts, instance_type_given=True).ttl_seconds == 86400
    with pytest.raises(objects.SubmitError) as err:
        objects.with_facts(objects.Request(**{**req.__dict__, "ttl_seconds": 86401}), facts, instance_type_given=True)
    assert str(err.value) == "--ttl 86401s: allowed: at most 24h (86400s, the platform's trainjobs.finishedJobRetentionMax)"
    unlimited = {**facts, "finishedJobRetentionMax": "Never"}
    assert objects.with_facts(objects.Request(**{**req.__dict__, "ttl_seconds": 10**8}), unlimited, instance_type_given=True).ttl_seconds == 10**8
    # a platform from before job TTLs publishes no maximum: its cleanup would ignore the annotation, so --ttl is refused
    older = {k: v for k, v in facts.items() if not k.startswith("finishedJobRetention")}
    with pytest.raises(objects.SubmitError, match="this platform does not delete jobs by their own TTL"):
        objects.with_facts(objects.Request(**{**req.__dict__, "ttl_seconds": 60}), older, instance_type_given=True)
    assert objects.with_facts(req, older, instance_type_given=True).ttl_seconds is None


def test_trainctl_submit_ttl_in_a_dry_run_and_refused_with_local(proj, capsys):
    import yaml

    rc = cli.main(["submit", "--dry-run", "--namespace", "vision", "--nodes", "1", "--ttl", "2h", str(proj), "--", "python", "train.py"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    job = next(d for d in yaml.safe_load_all(out) if d["kind"] == "TrainJob")
    assert job["metadata"]["annotations"][tj.TTL_ANNOTATION] == "7200"
    rc = cli.main(["submit", "--dry-run", "--namespace", "vision", "--nodes", "0", "--ttl", "2d", str(proj), "--", "python", "train.py"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and any(line.startswith("trainctl: error: --ttl '2d': allowed") for line in err) and any("--nodes" in line for line in err), err
    rc = cli.main(["submit", "--local", "--dry-run", "--nodes", "1", "--ttl", "1h", str(proj), "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert rc == 2 and "--ttl: not with --local" in err


def test_the_portals_field_is_judged_with_the_others():
    spec = JobSpec(namespace="vision", framework="pytorch", num_nodes=1, gpu_per_node=1, ttl_seconds=-1)
    with pytest.raises(Problems) as err:
        request_of(spec, None)
    assert [p["field"] for p in err.value.problems] == ["ttl_seconds_after_finished"]
    assert request_of(JobSpec(namespace="vision", framework="pytorch", num_nodes=1, gpu_per_node=1, ttl_seconds=600), None).ttl_seconds == 600
    with pytest.raises(Problems) as err:
        request_of(JobSpec(namespace="local", framework="pytorch", num_nodes=1, gpu_per_node=1, ttl_seconds=600), None, local=True)
    assert [p["field"] for p in err.value.problems] == ["ttl_seconds_after_finished"]


def test_a_default_longer_than_the_maximum_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        load_settings({"trainjobs": {"finishedJobRetention": "800h", "finishedJobRetentionMax": "720h"}}, stack="dev", region="us-west-2")
    assert str(err.value) == "invalid config training-platform:trainjobs.finishedJobRetention = '800h': longer than finishedJobRetentionMax (720h); allowed: at most that"
    assert load_settings({"trainjobs": {"finishedJobRetention": "800h", "finishedJobRetentionMax": "Never"}}, stack="dev", region="us-west-2").trainjobs.finished_job_retention == "800h"
    # unset, the maximum is 720h or a longer default: a stack that kept jobs longer keeps its meaning
    def applied(**trainjobs) -> str:
        return load_settings({"trainjobs": trainjobs}, stack="dev", region="us-west-2").trainjobs.retention_max()

    assert applied() == "720h" and applied(finishedJobRetention="24h") == "720h"
    assert applied(finishedJobRetention="1000h") == "1000h" and applied(finishedJobRetention="Never") == "Never"
    assert applied(finishedJobRetention="Never", finishedJobRetentionMax="48h") == "48h"


def test_an_annotation_that_is_no_number_of_seconds_is_said_and_the_stacks_retention_applies(capsys):
    from k8s.pods import trainjob_cleanup as tc

    job = {"metadata": {"name": "j", "namespace": "vision", "annotations": {tj.TTL_ANNOTATION: "2h"}}}
    assert tc.retention_of(job, retention_s=3600.0, max_s=None, ttl_annotation=tj.TTL_ANNOTATION) == 3600.0
    assert '"ignored": "vision/j"' in capsys.readouterr().out
    job["metadata"]["annotations"][tj.TTL_ANNOTATION] = "9" * 400  # clamped, never an error
    assert tc.retention_of(job, retention_s=None, max_s=60.0, ttl_annotation=tj.TTL_ANNOTATION) == 60.0
