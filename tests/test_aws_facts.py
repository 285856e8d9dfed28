"""The table of real AWS facts, and the mock runtime answering from it."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os

import pytest
import yaml

from config import aws_facts
from config.schema import ConfigError
from tests.conftest import PROJECT, dev_config, run_config, run_stack
from tools.mock_runtime import PlanMocks, ProgramError

REQUIRED = [
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "eu-west-1", "eu-central-1", "eu-north-1",
    "ap-northeast-1", "ap-southeast-2", "ap-south-1", "ca-central-1", "sa-east-1", "us-gov-west-1", "cn-north-1",
]  # fmt: skip


@contextlib.contextmanager
def _warnings():
    """The warnings a program logs under the mock runtime (pulumi.log.warn goes to the root
    logger there, as tools/render.py collects and prints them)."""
    messages: list[str] = []

    from config.deploy_rules import OFFLINE_NOTICE

    class _Handler(logging.Handler):
        def emit(self, record):
            if not record.getMessage().startswith(OFFLINE_NOTICE):  # the shipped stacks' placeholders (tests/test_deploy_placeholders.py)
                messages.append(record.getMessage())

    handler = _Handler(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        yield messages
    finally:
        logging.getLogger().removeHandler(handler)


def _zones_call(region: str) -> tuple[dict, list]:
    from pulumi.runtime import mocks as pmocks

    args = pmocks.MockCallArgs(token="aws:index/getAvailabilityZones:getAvailabilityZones", args={"state": "available"}, provider="")
    return PlanMocks(region).call(args)


def test_table_loads_with_its_source():
    assert aws_facts.regions() == sorted(aws_facts.regions())
    assert set(REQUIRED) <= set(aws_facts.regions())
    assert "aws_facts" not in aws_facts.SOURCE and "\n" not in aws_facts.SOURCE
    assert "karpenter-provider-aws" in aws_facts.SOURCE
    header = (PROJECT / "config" / "aws_facts.yaml").read_text().splitlines()[0]
    assert header.startswith("#")


@pytest.mark.parametrize("region", REQUIRED)
def test_every_zone_is_the_region_and_a_letter(region):
    zones = aws_facts.zones(region)
    assert zones == sorted(zones) and len(zones) >= 2
    assert all(z.startswith(region) and len(z) == len(region) + 1 and z[-1].isalpha() for z in zones)
    ids = aws_facts.zone_ids(region)
    assert len(ids) == len(aws_facts.account_zones(region)) and len(set(ids)) == len(ids)
    assert all(i.split("-az")[0] == ids[0].split("-az")[0] for i in ids)


def test_documented_zone_sets():
    assert aws_facts.zones("us-east-1") == [f"us-east-1{c}" for c in "abcdef"]
    assert aws_facts.zones("us-east-2") == [f"us-east-2{c}" for c in "abc"]
    assert aws_facts.zones("us-west-2") == [f"us-west-2{c}" for c in "abcd"]
    # us-west-1: an account sees two of the three letters
    assert aws_facts.zones("us-west-1") == [f"us-west-1{c}" for c in "abc"]
    assert len(aws_facts.account_zones("us-west-1")) == 2
    assert aws_facts.zone_ids("us-east-1")[0] == "use1-az1"


def test_partitions():
    assert aws_facts.partition("cn-north-1") == "aws-cn"
    assert aws_facts.partition("us-gov-west-1") == "aws-us-gov"
    assert {aws_facts.partition(r) for r in aws_facts.regions() if not r.startswith(("cn-", "us-gov-"))} == {"aws"}


def test_unknown_region_is_not_invented():
    assert not aws_facts.is_known_region("xx-east-9")
    with pytest.raises(KeyError):
        aws_facts.partition("xx-east-9")
    with pytest.raises(KeyError):
        aws_facts.zones("xx-east-9")
    assert aws_facts.offers("xx-east-9", "p5.48xlarge") is None


def test_offers_only_what_the_source_lists():
    assert aws_facts.offers("us-east-1", "p5.48xlarge") is True
    assert aws_facts.offers("us-east-1", "p5en.48xlarge") is True
    assert aws_facts.offers("cn-north-1", "p5.48xlarge") is False  # catalog family, not in the Region's list
    assert aws_facts.offers("us-gov-west-1", "g6.xlarge") is True
    assert aws_facts.offers("eu-west-1", "p5.48xlarge") is None  # no list for the Region
    assert aws_facts.offers("us-east-1", "m5.large") is None  # family the lists do not cover


def test_offered_types_are_catalog_types():
    catalog = set(yaml.safe_load((PROJECT / "config" / "gpu_instances.yaml").read_text())["types"])
    raw = yaml.safe_load((PROJECT / "config" / "aws_facts.yaml").read_text())
    for region, spec in raw["regions"].items():
        assert set((spec.get("offered") or {}).get("types", [])) <= catalog, region


@pytest.mark.parametrize("region", ["us-west-2", "us-east-1", "us-west-1", "cn-north-1"])
def test_mock_answers_zones_from_the_table(region):
    out, failures = _zones_call(region)
    assert failures == []
    assert out["names"] == aws_facts.account_zones(region)
    assert out["zoneIds"] == aws_facts.zone_ids(region)


def test_mock_fails_for_an_unknown_region():
    out, failures = _zones_call("xx-east-9")
    assert out == {} and failures and "xx-east-9" in failures[0][1]


def test_dev_subnets_use_the_first_table_zones():
    run = run_stack("dev")
    zones = sorted({r.inputs["availabilityZone"] for r in run.by_type("aws:ec2/subnet:Subnet")})
    assert zones == ["us-west-2a", "us-west-2b"]


def test_prod_keeps_its_explicit_zones():
    run = run_stack("prod")
    zones = sorted({r.inputs["availabilityZone"] for r in run.by_type("aws:ec2/subnet:Subnet")})
    assert zones == ["us-east-1a", "us-east-1b", "us-east-1c"]


def test_a_zone_the_table_does_not_list_fails():
    with pytest.raises(ProgramError, match="us-west-2e"):
        run_config(dev_config(efa={"enabled": True, "availabilityZone": "us-west-2e"}))


@pytest.mark.parametrize("region,partition", [("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov")])
def test_invented_arns_use_the_region_partition(region, partition):
    cfg = dev_config(**{"aws:region": region})
    cfg["training-platform:cluster"]["adminPrincipalArns"] = [f"arn:{partition}:iam::123456789012:role/PlatformAdmin"]
    cfg = json.loads(json.dumps(cfg).replace('"arn:aws:iam::', f'"arn:{partition}:iam::'))  # every principal the stack names (CI roles too)
    if partition == "aws-us-gov":  # GovCloud (US-West) sells no g5 on demand (the facts table): dev's jobs on g6
        cfg = json.loads(json.dumps(cfg).replace('"g5.', '"g6.'))
    run = run_config(cfg)
    arns = [r.state["arn"] for r in run.registrations if isinstance(r.state.get("arn"), str)]
    assert arns and all(a.startswith(f"arn:{partition}:") for a in arns)
    zones = {r.inputs["availabilityZone"] for r in run.by_type("aws:ec2/subnet:Subnet")}
    assert zones == set(aws_facts.account_zones(region)[:2])


def test_unknown_region_fails_the_program():
    with pytest.raises(ProgramError, match="not an AWS Region|allowed: an AWS Region"):
        run_config(dev_config(**{"aws:region": "xx-east-9"}))


def test_every_aws_region_is_accepted_and_the_gaps_are_said():
    """pulumi_aws.Region is the list of Regions; the facts table only adds zones and GPU offers.
    Where it has none, the config is not refused: what was not checked is named instead."""
    from config.settings import load_settings

    assert len(aws_facts.all_regions()) >= 40 and "ap-northeast-2" in aws_facts.all_regions()
    for region in aws_facts.all_regions():
        s = load_settings({}, stack="dev", region=region)
        assert s.region == region
        assert bool(s.fact_gaps()) != (aws_facts.is_known_region(region) and aws_facts.facts(region).offered is not None)
    assert aws_facts.gaps("us-east-1") == []
    assert len(aws_facts.gaps("eu-south-2")) == 2 and len(aws_facts.gaps("eu-west-1")) == 1  # Ireland's zones are in the table, not its offers
    assert aws_facts.gaps("ap-northeast-2") == []  # zones and offers
    with pytest.raises(ConfigError, match="did you mean 'ap-northeast-2'"):
        load_settings({}, stack="dev", region="ap-northaest-2")


@pytest.mark.parametrize("region,partition,suffix", [
    ("ap-northeast-2", "aws", "amazonaws.com"), ("eu-south-2", "aws", "amazonaws.com"), ("cn-northwest-1", "aws-cn", "amazonaws.com.cn"),
    ("us-gov-east-1", "aws-us-gov", "amazonaws.com"), ("eusc-de-east-1", "aws-eusc", "amazonaws.eu"), ("us-iso-east-1", "aws-iso", "c2s.ic.gov"),
])
def test_partitions_follow_botocores_rules(region, partition, suffix):
    assert aws_facts.partition(region) == partition and aws_facts.dns_suffix(partition) == suffix


@pytest.mark.parametrize("stack", ["dev", "teams", "workshop", "prod"])
def test_the_seed_stacks_render_in_seoul(stack):
    """ap-northeast-2, where the workshop and the seeds' eksctl cluster run: every stack renders
    there (prod's pinned zones moved to Seoul's)."""
    import yaml

    from tools.mock_runtime import run_program

    cfg = yaml.safe_load(open(f"Pulumi.{stack}.yaml"))
    # Seoul sells no p5.48xlarge on demand (config/aws_facts.yaml): prod's p5 work moves to p5en
    cfg = yaml.safe_load(yaml.safe_dump(cfg).replace("us-east-1", "ap-northeast-2").replace("p5.48xlarge", "p5en.48xlarge"))
    cfg["config"]["aws:region"] = "ap-northeast-2"
    with _warnings() as warned:
        run = run_program(".", stack, stack_config=cfg)
    assert warned == [], "the facts table covers the seeds' Region: nothing goes unchecked"
    zones = {r.inputs["availabilityZone"] for r in run.by_type("aws:ec2/subnet:Subnet")}
    assert zones and all(z.startswith("ap-northeast-2") for z in zones)


def test_region_name_rule_of_the_iam_policy_agrees_with_the_table():
    """infra.gpu_aws derives the partition from the region name (it must work for any region);
    the facts table states it: both must agree wherever the table knows the region."""
    from infra.gpu_aws import aws_partition

    for region in aws_facts.regions():
        assert aws_partition(region) == aws_facts.partition(region), region


SHIPPED = sorted(os.path.basename(p)[len("Pulumi."):-len(".yaml")] for p in glob.glob(str(PROJECT / "Pulumi.*.yaml")))
SEEDS_REGION = "ap-northeast-2"  # the workshop's and the seeds' eksctl cluster


def test_every_shipped_region_has_offers_with_a_source():
    regions = {yaml.safe_load((PROJECT / f"Pulumi.{s}.yaml").read_text())["config"]["aws:region"] for s in SHIPPED} | {SEEDS_REGION}
    assert {"us-west-2", "us-east-1"} <= regions
    raw = yaml.safe_load((PROJECT / "config" / "aws_facts.yaml").read_text())["regions"]
    for region in sorted(regions):
        assert aws_facts.facts(region).offered, region
        assert raw[region]["offered"]["source"].strip(), region


@pytest.mark.parametrize("stack", SHIPPED)
def test_a_render_of_a_shipped_stack_prints_no_warning(stack, tmp_path, capsys):
    from tools import render

    assert render.main(["--stack", stack, "--out", str(tmp_path)]) == 0
    from config.deploy_rules import OFFLINE_NOTICE

    out = capsys.readouterr().out
    # besides the one notice of the shipped stacks' placeholders (tests/test_deploy_placeholders.py)
    warnings = [line for line in out.splitlines() if line.startswith("warning:") and not line.startswith(f"warning: {OFFLINE_NOTICE}")]
    assert f"render: stack={stack}" in out and warnings == [], out


def test_the_render_says_what_the_table_cannot_judge(tmp_path, capsys):
    """The check above can fail: a Region without offers, and a type newer than the offers'
    source (p5.4xlarge in us-west-2), are each said once and not refused."""
    from tools.mock_runtime import run_program

    cfg = dev_config(**{"aws:region": "eu-west-1"})
    with _warnings() as warned:
        run_program(str(PROJECT), "dev", stack_config={"config": cfg})
    assert warned == ["no on-demand GPU offer list for eu-west-1 in config/aws_facts.yaml: whether the region sells the configured GPU types is not checked"]
    cfg = dev_config(trainjobs={"ddp": {"instanceType": "p5.4xlarge"}})
    with _warnings() as warned:
        run_program(str(PROJECT), "dev", stack_config={"config": cfg})
    assert len(warned) == 1 and "us-west-2 sells p5.4xlarge" in warned[0]


@pytest.mark.parametrize("region,offered,not_offered", [
    ("us-west-2", ["g5.xlarge", "g6e.48xlarge", "p4de.24xlarge", "p5.48xlarge", "p5en.48xlarge"], ["p5e.48xlarge"]),
    ("us-east-2", ["g5.12xlarge", "gr6.8xlarge", "p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge"], ["p4de.24xlarge", "p5e.48xlarge"]),
    ("ap-northeast-2", ["g5.xlarge", "g6.48xlarge", "p4d.24xlarge", "p5en.48xlarge"], ["p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge"]),
])
def test_offers_per_region_as_the_catalog_lists_them(region, offered, not_offered):
    """skypilot-catalog catalogs/v7/aws/vms.csv @001367d2: a Region row with an on-demand Price
    (offered), none or none with a Price (not offered); p5.4xlarge postdates it (unknown)."""
    assert all(aws_facts.offers(region, t) is True for t in offered)
    assert all(aws_facts.offers(region, t) is False for t in not_offered)
    assert aws_facts.offers(region, "p5.4xlarge") is None
    assert aws_facts.gaps(region) == [] and len(aws_facts.gaps(region, ["p5.4xlarge", "g5.xlarge"])) == 1


def test_a_type_not_sold_in_the_seeds_region_is_refused():
    cfg = dev_config(**{"aws:region": SEEDS_REGION}, trainjobs={"ddp": {"instanceType": "p5.48xlarge"}})
    with pytest.raises(ProgramError, match=r"trainjobs.ddp.instanceType.*not sold on demand in ap-northeast-2"):
        run_config(cfg)
