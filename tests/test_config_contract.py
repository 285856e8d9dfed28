"""The config contract: one render reports every invalid key, each rule has a clear message, and
the stack files' JSON Schema is generated from the same models."""

import json

import jsonschema
import pytest

from config import aws_facts, go_yaml
from config.schema import ConfigError, ConfigErrors
from config.settings import DdpJobSettings, EfaSettings, FsdpJobSettings, JobSettings, TrainerSettings, load_settings
from tests.conftest import PROJECT, dev_config, stack_file
from tools import config_json_schema

FOUR_MISTAKES = {
    "nodeGroups": {"arm": {"instanceType": "c6i.large"}},
    "gpuPool": {"capacityTypes": ["spot", "ondemand"]},
    "trainer": {"maxRestarts": -1},
    "trainjobs": {"ddp": {"numNode": 3}},
}
FOUR_LINES = [
    "invalid config training-platform:nodeGroups.arm.instanceType = 'c6i.large': allowed: a Graviton (ARM64) instance type such as c7g.2xlarge or m7g.xlarge",
    "invalid config training-platform:gpuPool.capacityTypes[1] = 'ondemand': did you mean 'on-demand'? allowed: on-demand, spot, reserved",
    "invalid config training-platform:trainer.maxRestarts = -1: allowed: an integer from 0 to 100",
    "invalid config training-platform:trainjobs.ddp.numNode = 3: unknown key; did you mean 'numNodes'? "
    "allowed keys: enabled, numNodes, instanceType, gpusPerNode, image, availabilityZone, extraArgs, activeDeadlineSeconds, terminationGraceSeconds, priority, stallTimeoutSeconds, env, secretEnv, epochs",
]


def load(raw, region="us-west-2", stack="dev"):
    return load_settings(raw, stack=stack, region=region)


def problems(raw, region="us-west-2") -> list[str]:
    with pytest.raises(ConfigError) as err:
        load(raw, region=region)
    return str(err.value).splitlines()


# --- every problem at once ---------------------------------------------------------------------


def test_four_independent_mistakes_are_four_lines_of_one_error():
    with pytest.raises(ConfigErrors) as err:
        load(FOUR_MISTAKES)
    assert str(err.value).splitlines() == FOUR_LINES
    assert err.value.keys == ["nodeGroups.arm.instanceType", "gpuPool.capacityTypes[1]", "trainer.maxRestarts", "trainjobs.ddp.numNode"]
    assert err.value.key == "nodeGroups.arm.instanceType"  # a ConfigError: the first problem's key/value/allowed
    assert all(isinstance(e, ConfigError) and str(e) == line for e, line in zip(err.value.errors, FOUR_LINES, strict=True))


def test_the_program_fails_with_every_problem_and_registers_nothing():
    from tools.mock_runtime import ProgramError, run_program

    with pytest.raises(ProgramError) as err:
        run_program(str(PROJECT), "dev", stack_config={"config": dev_config(**FOUR_MISTAKES)})
    # the program's error (what `pulumi up` prints) holds all four lines
    assert str(err.value.__cause__).splitlines() == FOUR_LINES
    assert [r for r in err.value.registrations if r.custom] == []


def test_cross_field_rules_of_valid_parts_are_reported_beside_field_errors():
    lines = problems({"nodeGroups": {"arm": {"minSize": "two"}, "x86": {"instanceType": "m7g.large"}}, "efa": {"enabled": True}, "trainer": {"version": "v9"}})
    assert [line.split(" = ")[0] for line in lines] == [
        "invalid config training-platform:nodeGroups.arm.minSize",
        "invalid config training-platform:nodeGroups.x86.instanceType",  # x86 parsed: its own rule still runs
        "invalid config training-platform:efa.availabilityZone",
        "invalid config training-platform:trainer.version",
    ]


def test_snake_case_keys_are_python_only():
    assert TrainerSettings(max_restarts=9).max_restarts == 9
    assert EfaSettings(enabled=True, availability_zone="us-west-2a", instance_types=["p5.48xlarge"]).availability_zone == "us-west-2a"
    assert problems({"trainer": {"max_restarts": 9}}) == [
        "invalid config training-platform:trainer.max_restarts = 9: unknown key; did you mean 'maxRestarts'? allowed keys: version, maxRestarts, shmSize, terminationGraceSeconds, graceClasses, progressInStatus, runtimes, allowUpgradeFrom"
    ]


def test_settings_are_frozen_and_jobs_share_one_model():
    s = load({})
    with pytest.raises(ValueError):
        s.trainer.max_restarts = 5  # type: ignore[misc]
    assert issubclass(DdpJobSettings, JobSettings) and issubclass(FsdpJobSettings, JobSettings)
    assert set(FsdpJobSettings.model_fields) - set(DdpJobSettings.model_fields) == {"model", "dataset", "download_gib"}
    assert (s.trainjobs.ddp.instance_type, s.trainjobs.fsdp.instance_type, s.trainjobs.ddp.epochs, s.trainjobs.fsdp.epochs) == ("g5.xlarge", "g5.12xlarge", 3, 1)


# --- rule 1: the TrainJobs namespace -------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace,what",
    [
        ("kube-system", "Kubernetes system components and Karpenter"),
        ("kube-public", "cluster-wide public data"),
        ("kube-node-lease", "node heartbeats"),
        ("default", "the namespace of everything unplaced"),
        ("kubeflow-system", "the Kubeflow Trainer controller"),
        ("kueue-system", "the Kueue controller"),
        ("tenant-storage", "the job that creates the teams' checkpoint directories"),
    ],
)
def test_trainjobs_may_not_use_a_system_namespace(namespace, what):
    assert problems({"trainjobs": {"namespace": namespace}}) == [
        f"invalid config training-platform:trainjobs.namespace = '{namespace}': a system namespace ({what}); "
        "allowed: a namespace of the platform's own such as training, not amazon-cloudwatch, default, kube-node-lease, kube-public, kube-system, kubeflow-system, kueue-system, monitoring, platform-ops, platform-portal, tenant-storage"
    ]
    assert load({"trainjobs": {"namespace": "research"}}).trainjobs.namespace == "research"


# --- rule 2: EFA zones ----------------------------------------------------------------------------

EFA = {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}


def test_an_efa_job_runs_in_the_efa_zone():
    raw = {"efa": EFA, "gpuPool": {"gpuLimit": 64}, "trainjobs": {"fsdp": {"enabled": True, "instanceType": "p5.48xlarge", "availabilityZone": "us-west-2b"}}}
    assert problems(raw) == [
        "invalid config training-platform:trainjobs.fsdp.availabilityZone = 'us-west-2b': the job runs in the EFA pool (p5.48xlarge is in efa.instanceTypes); allowed: efa.availabilityZone (us-west-2a)"
    ]
    raw["trainjobs"]["fsdp"]["availabilityZone"] = "us-west-2a"
    assert load(raw).pinned_zones() == ["us-west-2a"]
    # a job on a type outside the EFA pool may be pinned elsewhere
    assert load({"efa": EFA, "trainjobs": {"ddp": {"enabled": True, "availabilityZone": "us-west-2b"}}}).pinned_zones() == ["us-west-2a", "us-west-2b"]


def test_the_efa_zone_is_a_zone_of_the_cluster():
    assert problems({"network": {"availabilityZones": ["us-west-2a", "us-west-2b"]}, "efa": {**EFA, "availabilityZone": "us-west-2c"}}) == [
        "invalid config training-platform:efa.availabilityZone = 'us-west-2c': allowed: one of the cluster's zones (network.availabilityZones): us-west-2a, us-west-2b"
    ]
    assert problems({"efa": {**EFA, "availabilityZone": "us-west-2z"}}) == [
        "invalid config training-platform:efa.availabilityZone = 'us-west-2z': allowed: a zone of the stack's region us-west-2: us-west-2a, us-west-2b, us-west-2c, us-west-2d"
    ]
    # without explicit zones the VPC spans the pinned zone (infra/network.pick_zones)
    assert load({"network": {"availabilityZones": ["us-west-2a", "us-west-2c"]}, "efa": {**EFA, "availabilityZone": "us-west-2c"}}).efa.availability_zone == "us-west-2c"
    assert load({"efa": {**EFA, "availabilityZone": "us-west-2d"}}).pinned_zones() == ["us-west-2d"]


# --- rule 3: reserved capacity ----------------------------------------------------------------------


def test_reserved_capacity_needs_selector_terms_and_terms_need_reserved():
    assert problems({"gpuPool": {"capacityTypes": ["on-demand", "reserved"]}}) == [
        "invalid config training-platform:gpuPool.capacityReservationSelectorTerms = []: required when gpuPool.capacityTypes includes reserved; "
        "allowed: a list of {id: cr-...} or {tags: {...}, ownerId: ...} terms"
    ]
    assert problems({"gpuPool": {"capacityReservationSelectorTerms": [{"tags": {"team": "ml"}}]}}) == [
        "invalid config training-platform:gpuPool.capacityReservationSelectorTerms = [{'tags': {'team': 'ml'}}]: allowed only when gpuPool.capacityTypes includes reserved"
    ]
    terms = [{"id": "cr-0123456789abcdef0"}, {"tags": {"team": "ml"}, "ownerId": "123456789012"}]
    pool = load({"gpuPool": {"capacityTypes": ["on-demand", "reserved"], "capacityReservationSelectorTerms": terms}}).gpu_pool
    assert [t.karpenter() for t in pool.capacity_reservation_selector_terms] == [{"id": "cr-0123456789abcdef0"}, {"tags": {"team": "ml"}, "ownerID": "123456789012"}]


def test_each_selector_term_is_an_id_or_tags():
    terms = [{"id": "cr-123"}, {}, {"id": "cr-0123456789abcdef0", "ownerId": "123456789012"}, {"tags": {"team": "ml"}, "ownerId": "12"}, {"tags": {}}]
    key = "invalid config training-platform:gpuPool.capacityReservationSelectorTerms"
    assert problems({"gpuPool": {"capacityTypes": ["reserved"], "capacityReservationSelectorTerms": terms}}) == [
        f"{key}[0].id = 'cr-123': allowed: a capacity reservation id: cr- and 17 hex digits, such as cr-0123456789abcdef0",
        f"{key}[3].ownerId = '12': allowed: a 12-digit AWS account id",
        f"{key}[1] = {{}}: allowed: exactly one of id (a reservation id) or tags (a map of tag name to value)",
        f"{key}[2].ownerId = '123456789012': allowed only with tags (an id names one reservation already)",
        f"{key}[4].tags = {{}}: allowed: at least one tag",
    ]


def test_prod_uses_reserved_capacity_with_terms():
    cfg = stack_file("prod")["config"]
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}
    pool = load(raw, region=cfg["aws:region"], stack="prod").gpu_pool
    assert "reserved" in pool.capacity_types
    assert [t.karpenter() for t in pool.capacity_reservation_selector_terms] == [{"tags": {"training-platform/reservation": "prod"}}]


# --- rule 4: flags the platform sets ------------------------------------------------------------------


def test_extra_args_may_not_override_the_platforms_flags():
    raw = {
        "trainjobs": {
            "ddp": {"enabled": True, "extraArgs": ["--epochs", "5", "--data-dir=/data"]},
            "fsdp": {"extraArgs": ["--model=google-t5/t5-small", "--checkpoint-dir", "/tmp", "--dataset-dir", "/data", "--epoch", "2"]},
        }
    }
    ddp, fsdp = "invalid config training-platform:trainjobs.ddp", "invalid config training-platform:trainjobs.fsdp"
    other = "allowed: other flags of the training program"
    assert problems(raw) == [
        f"{ddp}.extraArgs[0] = '--epochs': --epochs is set by the platform from trainjobs.ddp.epochs; {other} (set trainjobs.ddp.epochs instead)",
        f"{ddp}.extraArgs[2] = '--data-dir=/data': --data-dir is set by the platform (the DDP job trains on generated digits; it never downloads MNIST); {other}",
        f"{fsdp}.extraArgs[0] = '--model=google-t5/t5-small': --model is set by the platform from trainjobs.fsdp.model; {other} (set trainjobs.fsdp.model instead)",
        f"{fsdp}.extraArgs[1] = '--checkpoint-dir': --checkpoint-dir is set by the platform to the job's directory on the checkpoint volume (trainjobs.checkpointStorage); {other}",
        f"{fsdp}.extraArgs[3] = '--dataset-dir': --dataset-dir is set by the platform to the dataset the dataset initializer downloaded (trainjobs.fsdp.dataset); {other}",
        f"{fsdp}.extraArgs[5] = '--epoch': --epoch (argparse reads it as --epochs) is set by the platform from trainjobs.fsdp.epochs; {other} (set trainjobs.fsdp.epochs instead)",
    ]
    ok = load({"trainjobs": {"fsdp": {"extraArgs": ["--activation-checkpointing", "--model-config", "t5-small", "--lr=1e-4", "--checkpoint-every", "50"]}}})
    assert ok.trainjobs.fsdp.extra_args[0] == "--activation-checkpointing"


# --- rule 5: region, zones and ARNs ---------------------------------------------------------------------


def test_the_region_must_be_known():
    (line,) = problems({}, region="us-west-9")
    assert line == "invalid config aws:region = 'us-west-9': did you mean 'us-west-2'? allowed: an AWS Region (pulumi_aws.Region), such as us-west-2 or ap-northeast-2; set aws:region in the stack file"
    assert load({}, region="eu-central-1").region == "eu-central-1"


def test_every_zone_is_a_zone_of_the_region():
    raw = {"network": {"availabilityZones": ["us-west-2a", "us-east-1b"]}, "trainjobs": {"ddp": {"enabled": True, "availabilityZone": "us-east-1a"}}}
    zones = "allowed: a zone of the stack's region us-west-2: us-west-2a, us-west-2b, us-west-2c, us-west-2d"
    assert problems(raw) == [
        f"invalid config training-platform:network.availabilityZones[1] = 'us-east-1b': {zones}",
        f"invalid config training-platform:trainjobs.ddp.availabilityZone = 'us-east-1a': {zones}",
    ]
    assert load({"network": {"availabilityZones": ["us-west-2a", "us-west-2b"]}, "trainjobs": {"ddp": {"enabled": True, "availabilityZone": "us-west-2b"}}})


def test_arns_are_in_the_stacks_region_and_partition():
    raw = {"cluster": {"secretsKmsKeyArn": "arn:aws:kms:us-east-1:123456789012:key/abc", "adminPrincipalArns": ["arn:aws-cn:iam::123456789012:role/Admin"]}}
    assert problems(raw) == [
        "invalid config training-platform:cluster.adminPrincipalArns[0] = 'arn:aws-cn:iam::123456789012:role/Admin': allowed: an ARN of the region's partition (us-west-2 is in aws: arn:aws:iam::...)",
        "invalid config training-platform:cluster.secretsKmsKeyArn = 'arn:aws:kms:us-east-1:123456789012:key/abc': "
        "allowed: a KMS key of the stack's region and partition (arn:aws:kms:us-west-2:...); EKS cannot use a key of another region",
    ]
    china = {"cluster": {"secretsKmsKeyArn": "arn:aws-cn:kms:cn-north-1:123456789012:key/abc", "adminPrincipalArns": ["arn:aws-cn:iam::123456789012:role/Admin"]}}
    assert load(china, region="cn-north-1").cluster.secrets_kms_key_arn == "arn:aws-cn:kms:cn-north-1:123456789012:key/abc"


# --- the editors' schema ------------------------------------------------------------------------------


def test_the_committed_schema_is_generated_from_the_models():
    path = PROJECT / config_json_schema.DEFAULT_PATH
    assert path.read_text() == config_json_schema.render(), "run `make schema`"


def _validator():
    schema = json.loads((PROJECT / config_json_schema.DEFAULT_PATH).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("stack", ["dev", "prod", "workshop"])
def test_every_stack_file_validates_against_the_schema_and_names_it(stack):
    text = (PROJECT / f"Pulumi.{stack}.yaml").read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=./schema/stack-config.schema.json"
    assert [e.message for e in _validator().iter_errors(go_yaml.load(text))] == []  # read as Pulumi reads it


def test_the_schema_refuses_what_the_models_refuse():
    doc = {"config": dev_config(trainer={"maxRestarts": -1}, gpuPool={"capacityTypes": ["ondemand"]}, trainjobs={"ddp": {"numNode": 3}})}
    doc["config"]["training-platform:bogus"] = {}
    doc["config"]["kubernetes:context"] = "kind"  # other namespaces pass
    found = sorted("/".join(map(str, e.absolute_path)) for e in _validator().iter_errors(doc))
    assert found == [
        "config",  # training-platform:bogus
        "config/training-platform:gpuPool/capacityTypes/0",
        "config/training-platform:trainer/maxRestarts",
        "config/training-platform:trainjobs/ddp",  # numNode
    ]
    bad_region = {"config": {**dev_config(), "aws:region": "mars-1"}}
    assert [e.message for e in _validator().iter_errors(bad_region)] == [f"'mars-1' is not one of {list(aws_facts.all_regions())!r}"]


def test_reservation_terms_reach_every_ec2_node_class_and_validate(need_schemas):
    from tests.conftest import find, objects, run_stack
    from tools import validate as v

    run = run_stack("prod")
    classes = [o for o in objects(run).values() if o["kind"] == "EC2NodeClass"]
    assert len(classes) == 3
    for nc in classes:
        assert nc["spec"]["capacityReservationSelectorTerms"] == [{"tags": {"training-platform/reservation": "prod"}}]
        assert v.validate(nc) == []
    assert "capacityReservationSelectorTerms" not in find(run_stack("dev"), "EC2NodeClass", "gpu")["spec"]


def test_reserved_capacity_needs_karpenter_mode():
    import pytest as _pytest

    from config.schema import ConfigError
    from config.settings import load_settings
    from tests.conftest import dev_config

    cfg = dev_config(gpuPool={"mode": "auto", "capacityTypes": ["reserved"], "capacityReservationSelectorTerms": [{"id": "cr-0123456789abcdef0"}]})
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}
    with _pytest.raises(ConfigError, match=r"gpuPool.capacityTypes = \['reserved'\]: reserved needs gpuPool.mode: karpenter"):
        load_settings(raw, stack="dev", region="us-west-2")
    raw["gpuPool"]["mode"] = "karpenter"
    assert load_settings(raw, stack="dev", region="us-west-2").gpu_pool.capacity_reservation_selector_terms[0].karpenter() == {"id": "cr-0123456789abcdef0"}


def test_a_field_error_does_not_hide_a_rule_across_sections():
    """extraArgs wrong in trainjobs and the EFA job in another zone: both in one run."""
    import pytest as _pytest

    from config.schema import ConfigError
    from config.settings import load_settings
    from tests.conftest import dev_config

    cfg = dev_config(
        efa={"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["g5.12xlarge"]},
        gpuPool={"gpuLimit": 64},
        trainjobs={"fsdp": {"availabilityZone": "us-west-2b", "extraArgs": ["--checkpoint-dir=/tmp/x"]}, "ddp": {"numNodes": "two"}},
    )
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}
    with _pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    keys = getattr(err.value, "keys", [err.value.key])
    assert "trainjobs.ddp.numNodes" in keys
    assert any(k.startswith("trainjobs.fsdp.extraArgs") for k in keys)
    assert "trainjobs.fsdp.availabilityZone" in keys


def test_byo_vpc_with_pinned_zones_must_name_the_subnets_zones():
    import pytest as _pytest

    from config.schema import ConfigError
    from config.settings import load_settings
    from tests.conftest import dev_config

    byo = {"vpcId": "vpc-0abc12345def67890", "privateSubnetIds": ["subnet-0abc1234", "subnet-0def5678"]}  # (azCount: a new VPC's only)
    cfg = dev_config(network=byo, trainjobs={"fsdp": {"availabilityZone": "us-west-2b"}})
    cfg["training-platform:network"] = byo
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}
    with _pytest.raises(ConfigError, match=r"network.availabilityZones = \[\]: required with network.vpcId"):
        load_settings(raw, stack="dev", region="us-west-2")
    raw["network"] = {**byo, "availabilityZones": ["us-west-2a", "us-west-2b"]}
    assert load_settings(raw, stack="dev", region="us-west-2").network.vpc_id == byo["vpcId"]
