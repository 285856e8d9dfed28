"""make cost: a stack's hourly cost from the price table, and the vCPU quotas its jobs need."""

from __future__ import annotations

import pytest

from config import catalog, costs
from tests.conftest import PROJECT
from tools import cost


def test_dev_is_priced_from_the_table_at_its_configured_sizes():
    p = costs.prices()
    est = cost.estimate_for("dev")
    always = p.eks_control_plane_per_hour + 2 * p.instances["c7g.2xlarge"] + 2 * p.instances["c6i.2xlarge"]
    assert est.always_on_per_hour == pytest.approx(always)
    jobs = 6 * p.instances["g5.xlarge"] + 2 * p.instances["g5.12xlarge"]  # ddp, tf, ncclCheck: 2 x g5.xlarge each; fsdp 2 x g5.12xlarge
    assert est.all_jobs_per_hour == pytest.approx(always + jobs)
    assert est.quotas == {"Running On-Demand G and VT instances": 6 * 4 + 2 * 48}
    assert est.missing_prices == []


def test_prod_needs_the_p_quota_and_counts_one_nat_gateway_per_zone():
    est = cost.estimate_for("prod")
    assert est.quotas == {"Running On-Demand P instances": 4 * catalog.lookup("p5.48xlarge").vcpu}
    assert any(u.startswith("3 NAT gateway") for u in est.unpriced)


def test_every_instance_type_of_the_shipped_stacks_has_a_price():
    for path in PROJECT.glob("Pulumi.*.yaml"):
        if path.name != "Pulumi.yaml":
            assert cost.estimate_for(path.name.split(".")[1]).missing_prices == [], path.name


def test_a_type_without_a_price_is_said_not_silently_zero():
    table = costs.Prices(region="us-east-1", date="2026-07-06", eks_control_plane_per_hour=0.1, instances={})
    est = costs.estimate(_dev_settings(), table)
    assert "g5.xlarge" in est.missing_prices and "no price in config/prices.yaml for" in costs.render(est)


def test_prices_of_another_region_are_said_so():
    out = costs.render(cost.estimate_for("dev"))
    assert "(us-east-1, 2026-07-06); they may differ in us-west-2" in out


def test_bad_config_is_one_line_per_problem_and_exit_2(tmp_path, capsys, monkeypatch):
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  aws:region: us-west-2\n  training-platform:nodeGroups:\n    arm: {desiredSize: 9, maxSize: 4}\n    x86: {nope: 1}\n")
    monkeypatch.setattr(cost, "ROOT", tmp_path)
    monkeypatch.setattr(cost, "estimate_for", lambda stack, root=tmp_path: _estimate_for(stack, root))
    assert cost.main(["--stack", "bad"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("cost: bad: invalid config") for line in err) and "Traceback" not in "".join(err)


_estimate_for = cost.estimate_for


def _dev_settings():
    from config.settings import load_settings
    from tests.conftest import stack_file

    cfg = stack_file("dev")["config"]
    return load_settings({k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}, stack="dev", region=cfg["aws:region"])
