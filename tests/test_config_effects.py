"""Every key takes effect or is refused with the reason (issue: bad input, round 4): keys that
would do nothing in the stack, guards that would guard nothing, values that break jobs only at
run time, secrets never printed back, and what only a real deploy refuses."""

from __future__ import annotations

import json

import pytest

from config.program_flags import argument_problems, program_flags
from config.schema import REDACTED, ConfigErrors, looks_secret
from config.settings import load_settings
from tests.conftest import PROJECT, dev_config
from tools.mock_runtime import SECRET_MASK, run_program

WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"


def problems(raw: dict) -> ConfigErrors:
    with pytest.raises(ConfigErrors) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    return err.value


def keys(raw: dict) -> list[str]:
    return sorted(problems(raw).keys)


def ok(raw: dict):
    return load_settings(raw, stack="dev", region="us-west-2")


KUEUE_OFF = {"kueue": {"enabled": False}}


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"trainjobs": {"ddp": {"enabled": True, "priority": "high"}}}, "trainjobs.ddp.priority"),
        ({"trainjobs": {"fsdp": {"enabled": True, "priority": "low"}}}, "trainjobs.fsdp.priority"),
        ({"trainjobs": {"tf": {"enabled": True, "priority": "normal"}}}, "trainjobs.tf.priority"),  # set, even to the default
        ({"kueue": {"podsReadyTimeout": "30m"}}, "kueue.podsReadyTimeout"),
        ({"kueue": {"enabled": False, "requeueLimit": 5}}, "kueue.requeueLimit"),
        ({**KUEUE_OFF, "tenants": {"vision": {"gpuQuota": 2, "defaultPriority": "high"}}}, "tenants.vision.defaultPriority"),
    ],
)
def test_kueue_keys_with_kueue_off_are_refused(raw, key):
    err = problems(raw)
    assert err.keys == [key] and "Kueue is off" in str(err)


def test_kueue_keys_are_taken_where_kueue_runs():
    s = ok({"tenants": {"vision": {"gpuQuota": 2, "defaultPriority": "high"}}, "kueue": {"podsReadyTimeout": "60m", "requeueLimit": 5}, "trainjobs": {"ddp": {"enabled": True, "priority": "high"}}})
    assert s.kueue_enabled and s.trainjobs.ddp.priority == "high"


@pytest.mark.parametrize(
    ("storage", "key"),
    [
        ({"type": "efs", "capacityGib": 2400}, "trainjobs.checkpointStorage.capacityGib"),
        ({"type": "efs", "throughputPerTib": 500}, "trainjobs.checkpointStorage.throughputPerTib"),
        ({"type": "efs", "backupRetentionDays": 14}, "trainjobs.checkpointStorage.backupRetentionDays"),
        ({"type": "efs", "backupRetentionDays": 7}, "trainjobs.checkpointStorage.backupRetentionDays"),
    ],
)
def test_fsx_keys_and_a_retention_efs_cannot_keep_are_refused_with_efs(storage, key):
    assert keys({"trainjobs": {"checkpointStorage": storage, "ddp": {"enabled": True}}}) == [key]


def test_efs_backups_on_or_off_and_fsx_keys_with_fsx_are_taken():
    for days in (0, 35):
        ok({"trainjobs": {"checkpointStorage": {"type": "efs", "backupRetentionDays": days}}})
    ok({"trainjobs": {"checkpointStorage": {"type": "fsx", "capacityGib": 2400, "throughputPerTib": 500, "backupRetentionDays": 14}}})


@pytest.mark.parametrize(
    ("obs", "key"),
    [
        ({"mode": "prometheus", "logRetentionDays": 7}, "observability.logRetentionDays"),
        ({"mode": "none", "logRetentionDays": 7}, "observability.logRetentionDays"),
        ({"mode": "prometheus", "alarms": {"emails": ["oncall@example.com"]}}, "observability.alarms.emails"),
        ({"mode": "prometheus", "alarms": {"httpsEndpoints": ["https://pager.example.com/hook"]}}, "observability.alarms.httpsEndpoints"),
        ({"mode": "none", "alarms": {"idleMinutes": 30}}, "observability.alarms.idleMinutes"),
        ({"alarms": {"idleMinutes": 15}}, "observability.alarms.idleMinutes"),
        ({"alarms": {"idleMinutes": 45}}, "observability.alarms.idleMinutes"),
        ({"alarms": {"idleGpuPercent": 100}}, "observability.alarms.idleGpuPercent"),
        ({"alarms": {"emails": ["oncall@example.com", "OnCall@example.com"]}}, "observability.alarms.emails[1]"),
        ({"alarms": {"httpsEndpoints": ["https://pager.example.com/a", "https://pager.example.com/a"]}}, "observability.alarms.httpsEndpoints[1]"),
    ],
)
def test_observability_keys_that_would_do_nothing_are_refused(obs, key):
    assert keys({"observability": obs}) == [key]


def test_prometheus_keeps_its_idle_alert_settings_and_multiples_of_ten_are_taken():
    s = ok({"observability": {"mode": "prometheus", "alarms": {"idleMinutes": 30, "idleGpuPercent": 99}}})
    assert s.observability.alarms.idle_minutes == 30


@pytest.mark.parametrize(
    ("jobs", "key", "text"),
    [
        ({"tf": {"enabled": True, "stallTimeoutSeconds": 600}}, "trainjobs.tf.stallTimeoutSeconds", "tf_mnist.py has no stall watchdog"),
        ({"ncclCheck": {"enabled": True, "instanceType": "g5.xlarge", "minBusBwGBps": 1, "stallTimeoutSeconds": 600}}, "trainjobs.ncclCheck.stallTimeoutSeconds", "allreduce_check.py has no stall watchdog"),
        ({"ddp": {"enabled": True, "stallTimeoutSeconds": 5}}, "trainjobs.ddp.stallTimeoutSeconds", "at least 300"),
        ({"fsdp": {"enabled": True, "stallTimeoutSeconds": 299}}, "trainjobs.fsdp.stallTimeoutSeconds", "at least 300"),
        ({"ddp": {"enabled": True, "activeDeadlineSeconds": 60}}, "trainjobs.ddp.activeDeadlineSeconds", "this stack allows a job to start"),
        # the FSDP job's 16 GiB download makes the start allowance longer than 15 min
        ({"fsdp": {"enabled": True, "activeDeadlineSeconds": 1000}}, "trainjobs.fsdp.activeDeadlineSeconds", "this stack allows a job to start"),
    ],
)
def test_guards_that_would_guard_nothing_are_refused(jobs, key, text):
    err = problems({"trainjobs": jobs})
    assert err.keys == [key] and text in str(err)


def test_guards_that_guard_are_taken_and_watchdog_less_programs_get_no_watchdog_env():
    s = ok({"trainjobs": {"ddp": {"enabled": True, "stallTimeoutSeconds": 0, "activeDeadlineSeconds": 7200}, "fsdp": {"enabled": True, "stallTimeoutSeconds": 300}}})
    assert s.trainjobs.fsdp.stall_timeout_seconds == 300
    from workloads.builders.trainjobs import STALL_ENV, _stall_env

    assert _stall_env(s.trainjobs.fsdp) == [{"name": STALL_ENV, "value": "300"}]
    assert _stall_env(s.trainjobs.tf) == [] and _stall_env(s.trainjobs.nccl_check) == []


# --- extraArgs, judged by the program's own parser --------------------------------------------


def test_the_programs_flags_are_read_from_their_parsers():
    ddp = program_flags("ddp_mnist.py")
    assert ddp["--lr"].takes_value and ddp["--lr"].kind is float and not ddp["--synthetic"].takes_value
    assert program_flags("fsdp_t5.py")["--precision"].choices == ("auto", "bf16", "fp32")
    for program in ("ddp_mnist.py", "fsdp_t5.py", "tf_mnist.py", "allreduce_check.py"):
        assert "--checkpoint-dir" in program_flags(program) or program == "allreduce_check.py"


@pytest.mark.parametrize(
    ("job", "args", "index", "text"),
    [
        ("ddp", ["--learning-rate", "0.1"], 0, "ddp_mnist.py has no flag --learning-rate"),
        ("ddp", ["--lr", "fast"], 0, "--lr of ddp_mnist.py takes a number"),
        ("ddp", ["--batch-size=big"], 0, "takes an integer"),
        ("ddp", ["--synthetic=yes"], 0, "takes no value"),
        ("ddp", ["--seed"], 0, "needs a value"),
        ("ddp", ["stray"], 0, "takes no positional arguments"),
        ("fsdp", ["--precision", "fp16"], 0, "takes one of: auto, bf16, fp32"),
        ("fsdp", ["--checkpoint-m", "sync", "--compile"], None, None),  # a unique prefix is argparse's
        ("fsdp", ["--s", "1"], 0, "ambiguous"),
        ("tf", ["--momentum", "0.5", "--lr=0.1"], None, None),
    ],
)
def test_extra_args_are_judged_by_the_programs_parser(job, args, index, text):
    raw = {"trainjobs": {job: {"enabled": True, "extraArgs": args}}}
    if index is None:
        ok(raw)
        return
    err = problems(raw)
    assert err.keys == [f"trainjobs.{job}.extraArgs[{index}]"] and text in str(err)


def test_argument_problems_never_name_values():
    found = argument_problems("ddp_mnist.py", ["--lr", "s3cr3t-value", "--nope=s3cr3t-value"])
    assert len(found) == 2 and all("s3cr3t" not in why for _, why in found)


# --- secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--hf-token", "hf_abcdefghijklmnopqrstu"],
        ["--wandb-key", WANDB_KEY],
        ["--wandb-api-key=abc123def456"],
        ["--password", "hunter2hunter2"],
        [f"--note={WANDB_KEY}"],
    ],
)
def test_credentials_in_extra_args_are_refused_and_never_printed(args):
    err = problems({"trainjobs": {"ddp": {"enabled": True, "extraArgs": args}}})
    text = str(err)
    assert "looks like a credential" in text and "hfTokenSecret" in text
    for a in args:
        for part in (a, a.partition("=")[2]):
            if part and len(part) > 8 and not part.startswith("--"):
                assert part not in text


@pytest.mark.parametrize(
    ("raw", "secret"),
    [
        ({"trainjobs": {"ddp": {"enabled": True, "extraArgs": f"--wandb-key {WANDB_KEY}"}}}, WANDB_KEY),  # a string, not a list
        ({"trainjobs": {"ddp": {"enabled": True, "extraArgs": {"--wandb-key": WANDB_KEY}}}}, WANDB_KEY),
        ({"observability": {"alarms": {"httpsEndpoints": ["ftp://ops:Sup3rS3cret@pager.example.com/x"]}}}, "Sup3rS3cret"),
        ({"observability": {"alarms": {"httpsEndpoints": "https://hooks.example.com/services/T000/B000/XXXXSECRETPATH"}}}, "XXXXSECRETPATH"),
        ({"observability": {"mode": "prometheus", "alarms": {"httpsEndpoints": ["https://hooks.example.com/services/T0/B0/XXXXSECRETPATH"]}}}, "XXXXSECRETPATH"),
    ],
)
def test_no_error_line_prints_a_secret(raw, secret):
    assert secret not in str(problems(raw))


def test_an_endpoint_with_credentials_is_accepted_and_rendered_as_a_pulumi_secret():
    url = "https://ops:Sup3rS3cret@pager.example.com/hook"
    s = ok({"observability": {"alarms": {"httpsEndpoints": [url]}}})
    assert s.observability.alarms.https_endpoints == [url]
    assert looks_secret("observability.alarms.httpsEndpoints[0]", "https://pager.example.com/x")
    run = run_program(str(PROJECT), "dev", stack_config={"config": dev_config(observability={"alarms": {"httpsEndpoints": [url]}})})
    sub = next(r for r in run.registrations if r.type == "aws:sns/topicSubscription:TopicSubscription" and r.inputs.get("protocol") == "https")
    assert sub.inputs["endpoint"] == SECRET_MASK  # a Pulumi secret: the engine gets it masked, never the URL


@pytest.mark.parametrize("value", [{"training-platform:observability": {"secure": "v1:AAAABBBBCCCC"}}])
def test_secure_values_stop_the_offline_render_with_one_line(value):
    """A whole section set with --secret: its value unknown offline, no plan can be made from it.
    (A secure leaf renders: test_a_secure_leaf_renders_as_an_unknown_secret.)"""
    from config.stack_file import StackFileError

    config = {**dev_config(), **value}
    with pytest.raises(StackFileError) as err:
        run_program(str(PROJECT), "dev", stack_config={"config": config})
    text = str(err.value)
    assert len(text.splitlines()) == 1 and "cannot decrypt" in text and "pulumi config set --secret" in text and "AAAABBBB" not in text


def test_a_secure_leaf_renders_as_an_unknown_secret():
    """Set with pulumi config set --secret --path: offline its value is unknown, the render masks it (as
    pulumi preview shows a secret) and no one needs plain test values in a stack file."""
    value = {"training-platform:observability": {"alarms": {"httpsEndpoints": [{"secure": "v1:AAAABBBBCCCC"}]}}}
    run = run_program(str(PROJECT), "dev", stack_config={"config": {**dev_config(), **value}})
    sub = next(r for r in run.registrations if r.type == "aws:sns/topicSubscription:TopicSubscription" and r.inputs.get("protocol") == "https")
    assert sub.inputs["endpoint"] == SECRET_MASK
    assert "AAAABBBB" not in json.dumps(run.plan())


# --- values that break jobs only at run time ----------------------------------------------------


def test_a_valid_cpu_quantity_in_millicores_is_taken():
    assert ok({"tenants": {"vision": {"gpuQuota": 1, "cpuQuota": "1500m"}}}).tenants.teams()["vision"].cpu_quota == "1500m"
    assert keys({"tenants": {"vision": {"gpuQuota": 1, "cpuQuota": "1500x"}}}) == ["tenants.vision.cpuQuota"]


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({**KUEUE_OFF, "tenants": {"vision": {"gpuQuota": 1, "memoryQuota": "1Gi"}}}, "tenants.vision.memoryQuota"),
        ({**KUEUE_OFF, "tenants": {"vision": {"gpuQuota": 1, "cpuQuota": "500m"}}}, "tenants.vision.cpuQuota"),
        ({"tenants": {"vision": {"gpuQuota": 1, "memoryQuota": "1Gi"}}}, "tenants.vision.memoryQuota"),  # with Kueue: a guarantee that runs nothing
        ({"tenants": {"vision": {"gpuQuota": 1, "cpuQuota": "500m"}}}, "tenants.vision.cpuQuota"),
        ({"tenants": {"vision": {"gpuQuota": 1}}, "trainer": {"runtimes": ["tensorflow-distributed"]}}, "trainer.runtimes"),
        ({"tenants": {"kube-vision": {"gpuQuota": 1}}}, "tenants.kube-vision"),
        ({"tenants": {"vision": {"gpuQuota": 1, "namespace": "kube-vision"}}}, "tenants.vision.namespace"),
        ({"gpuPool": {"capacityTypes": ["reserved"], "capacityReservationSelectorTerms": [{"tags": {"team": ""}}]}}, "gpuPool.capacityReservationSelectorTerms[0].tags.team"),
    ],
)
def test_values_that_would_break_jobs_at_run_time_are_refused(raw, key):
    assert key in problems(raw).keys


def test_progress_in_status_is_refused_by_a_real_deploy_and_warned_offline():
    from config.deploy_rules import deploy_problems

    s = ok({"trainer": {"progressInStatus": True}})
    assert [p.key for p in deploy_problems(s)] == ["trainer.progressInStatus"]
    assert deploy_problems(ok({})) == []
    assert REDACTED not in str(deploy_problems(s)[0])


# --- round 4 review: other members of each class ----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"observability": {"alarms": {"enabled": False, "emails": ["oncall@example.com"]}}}, "observability.alarms.emails"),
        ({"observability": {"alarms": {"enabled": False, "idleMinutes": 30}}}, "observability.alarms.idleMinutes"),
        ({"observability": {"mode": "none", "alarms": {"enabled": True}}}, "observability.alarms.enabled"),
        ({"smokeChecks": {"enabled": False, "instanceType": "g5.xlarge"}}, "smokeChecks.instanceType"),
        ({"efa": {"availabilityZone": "us-west-2a"}}, "efa.availabilityZone"),
        ({"efa": {"instanceTypes": ["p5.48xlarge"]}}, "efa.instanceTypes"),
        ({"network": {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"], "natGateways": "perAz"}}, "network.natGateways"),
        ({"cluster": {"allowPublicAccessFromAnywhere": True}}, "cluster.allowPublicAccessFromAnywhere"),
        ({"trainjobs": {"ddp": {"enabled": True, "stallTimeoutSeconds": 86400, "activeDeadlineSeconds": 7200}}}, "trainjobs.ddp.stallTimeoutSeconds"),
        ({"tenants": {"vision": {"gpuQuota": 1, "namespace": "platform-portal"}}}, "tenants.vision.namespace"),
        ({"trainjobs": {"namespace": "kube-jobs"}}, "trainjobs.namespace"),
        ({"cluster": {"adminPrincipalArns": ["arn:aws:iam::111111111111:role/ops/Admin"]}, "tenants": {"vision": {"gpuQuota": 1, "principalArns": ["arn:aws:iam::111111111111:role/Admin"]}}}, "tenants.vision.principalArns[0]"),
        ({"tenants": {"a": {"gpuQuota": 1, "principalArns": ["arn:aws:iam::111111111111:role/x/R"]}, "b": {"gpuQuota": 1, "principalArns": ["arn:aws:iam::111111111111:role/R"]}}}, "tenants.b.principalArns[0]"),
        ({"observability": {"alarms": {"httpsEndpoints": ["https://Pager.example.com/a", "https://pager.example.com/a"]}}}, "observability.alarms.httpsEndpoints[1]"),
    ],
)
def test_more_members_of_each_class_are_refused(raw, key):
    assert key in problems(raw).keys


@pytest.mark.parametrize(
    "tenant",
    [{"cpuQuota": "1e3"}, {"cpuQuota": "+400"}, {"cpuQuota": "400."}, {"cpuQuota": "1E3"}, {"memoryQuota": "129e10"}, {"memoryQuota": "1e12"}, {"memoryQuota": "1.5Ti"}],
)
def test_valid_quantities_are_taken(tenant):
    ok({"tenants": {"vision": {"gpuQuota": 1, **tenant}}})


@pytest.mark.parametrize(
    ("raw", "secret"),
    [
        ({"observability": {"alarms": {"httpsEndpoint": ["https://hooks.example.com/services/T0/B0/Sup3rS3cretPw"]}}}, "Sup3rS3cretPw"),  # a misspelt key
        ({"wandb": {"key2": "Sup3rS3cretPw"}}, "Sup3rS3cretPw"),  # an unknown section
        ({"trainjobs": {"ddp": {"enabled": True, "extraArgs": ["Sup3rS3cretPw"]}}}, "Sup3rS3cretPw"),  # a positional argument
        ({"cluster": {"adminPrincipalArns": ["arn:aws:sts::111111111111:assumed-role/x/y?X-Amz-Security-Token=Sup3rS3cretPw"]}}, "Sup3rS3cretPw"),
        ({"trainjobs": {"fsdp": {"enabled": True, "model": "hf://Sup3rS3cretPw@x/y"}}}, "Sup3rS3cretPw"),
        ({"trainjobs": {"ddp": {"enabled": True, "image": "ops:Sup3rS3cretPw@registry/org/img:1"}}}, "Sup3rS3cretPw"),
    ],
)
def test_no_refusal_prints_a_value_that_may_hold_a_secret(raw, secret):
    assert secret not in str(problems(raw))


def test_spot_is_said_to_end_training_pods_without_their_grace_period():
    """On a spot interruption Karpenter's drain skips do-not-disrupt pods (config/effect_rules.py
    names the sources), so with spot in the capacity types the render says what that costs, once,
    whatever the grace periods; the config stays valid; on-demand only, nothing is said."""
    from config.effect_rules import spot_advice

    for raw in ({"gpuPool": {"capacityTypes": ["spot", "on-demand"]}}, {"gpuPool": {"capacityTypes": ["spot"]}, "trainer": {"terminationGraceSeconds": 60}}):
        [advice] = spot_advice(ok(raw))
        assert "karpenter.sh/do-not-disrupt" in advice and "last checkpoint" in advice
    assert spot_advice(ok({"trainer": {"terminationGraceSeconds": 600}})) == []


def test_the_render_says_the_spot_advice_once(capsys):
    from tests.test_aws_facts import _warnings

    cfg = dev_config(gpuPool={"capacityTypes": ["spot"]})
    with _warnings() as warned:
        run_program(str(PROJECT), "dev", stack_config={"config": cfg})
    assert len(warned) == 1 and warned[0].startswith("gpuPool.capacityTypes includes spot"), warned
