"""Bad input, round 6: every problem at once also when another item of the same list, or a value
inside the same map entry, failed its own check; one line for one key."""

from __future__ import annotations

import copy

import pytest

from config.schema import ConfigError
from config.settings import load_settings
from tests.conftest import stack_file
from tests.e2e.portal_helpers import PORTAL

ROLE = "arn:aws:iam::123456789012:role/A"
DUP = "also {name}[{first}]; allowed: a list without duplicates"


def keys(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    return [f"{e.key} = {e.value!r}" for e in err.value.errors]


def teams_stack(**sections) -> dict:
    raw = {k.split(":", 1)[1]: v for k, v in copy.deepcopy(stack_file("teams")["config"]).items() if k.startswith("training-platform:")}
    return {**raw, **sections}


def portal(**changes) -> dict:
    return {**copy.deepcopy(PORTAL), "clientSecret": "s", **changes}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["10.0.0.0/8", "10.0.0.0/8", "bad"]}}, ["cluster.publicAccessCidrs[2] = 'bad'", "cluster.publicAccessCidrs[1] = '10.0.0.0/8'"]),
        ({"gpuPool": {"instanceCategories": ["g", "g", "z"]}}, ["gpuPool.instanceCategories[2] = 'z'", "gpuPool.instanceCategories[1] = 'g'"]),
        ({"cluster": {"adminPrincipalArns": [ROLE, "bad", ROLE]}}, ["cluster.adminPrincipalArns[1] = 'bad'", f"cluster.adminPrincipalArns[2] = {ROLE!r}"]),
        ({"tenants": {"vision": {"gpuQuota": 2, "principalArns": [ROLE, ROLE, "bad"]}}}, ["tenants.vision.principalArns[2] = 'bad'", f"tenants.vision.principalArns[1] = {ROLE!r}"]),
    ],
)
def test_a_repeated_item_is_named_beside_a_bad_item_of_the_same_list(raw, expected):
    assert keys(raw) == expected


def test_a_bad_public_access_cidr_does_not_hide_the_other_rules_of_the_cluster():
    assert keys({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["bad"], "adminPrincipalArns": [ROLE, ROLE]}}) == [
        "cluster.publicAccessCidrs[0] = 'bad'", f"cluster.adminPrincipalArns[1] = {ROLE!r}"
    ]
    with pytest.raises(ConfigError) as err:
        load_settings({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["10.0.0.0/8", "10.0.0.0/8"]}}, stack="dev", region="us-west-2")
    assert str(err.value).endswith(DUP.format(name="publicAccessCidrs", first=0))


def test_portal_logins_repeated_beside_a_bad_one_and_a_team_that_is_no_tenant_beside_a_bad_group():
    emails = keys(teams_stack(portal=portal(teams={"vision": {"emails": ["a@example.com", "A@example.com", "bad"]}})))
    assert emails == ["portal.teams.vision.emails[2] = 'bad'", "portal.teams.vision.emails[1] = 'A@example.com'"]
    ghost = keys(teams_stack(portal=portal(teams={"vision": {"groups": ["g"]}, "ghost": {"groups": ["system:x"]}})))
    assert ghost == ["portal.teams.ghost.groups[0] = 'system:x'", "portal.teams.ghost = 'ghost'"]


def test_portal_inbound_cidrs_repeated_and_one_line_for_one_key():
    with pytest.raises(ConfigError) as err:
        load_settings(teams_stack(portal=portal(inboundCidrs=["10.1.0.0/16", "10.1.0.0/16"])), stack="teams", region="us-west-2")
    assert [e.key for e in err.value.errors] == ["portal.inboundCidrs[1]"] and "also inboundCidrs[0]" in str(err.value)
    assert keys(teams_stack(portal={"enabled": False, "inboundCidrs": []})) == ["portal.inboundCidrs = []"]


# --- trainctl names the variable that makes a TrainJob too large, as the render does ----------------


def test_trainctl_blames_the_large_environment_value_not_the_code_files(tmp_path):
    from trainctl.code import collect
    from trainctl.objects import Request, SubmitError, build

    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(SubmitError) as err:
        build(Request(namespace="vision", nodes=2, command=["python", "train.py"], env=(("BIG", "x" * 2_000_000), ("SMALL", "1"))), collect(tmp_path))
    message = str(err.value)
    assert message.startswith("--env BIG: its TrainJob ") and "etcd" in message and "BIG 2000000 bytes" in message and "SMALL 1 bytes" in message
    assert "ship fewer files" not in message and "x" * 100 not in message and len(message.splitlines()) == 1
