"""The submit form's options beside the job's shape (trainctl/portal/form.py, templates/submit.html):
Clone & edit carries a job's Kueue priority, TTL, requirements install time limit and grace period
(resubmitted unchanged, the same TrainJob), each judged by trainctl's rules with one problem per
field, and the API takes them too; a refused post keeps every value; the size presets no GPU pool
of the cluster runs are shown disabled with the reason; the API refuses an empty program."""

from __future__ import annotations

import html
import re

import pytest
import yaml

from tests.test_portal_form import FakeKube, _built, _code, _post, _problems, _request, _resubmitted, alb, read_form, ui  # noqa: F401  (fixtures)
from trainctl import local, objects
from trainctl.code import collect
from trainctl.portal import form, service

FACTS = {"kueue": True, "priorities": ["low", "normal", "high"], "defaultPriority": "normal", "finishedJobRetentionMax": "720h",
         "pools": [{"name": "gpu-pool", "instanceTypes": ["g5.2xlarge"], "efa": False}, {"name": "efa-pool", "instanceTypes": ["p4d.24xlarge"], "efa": True}]}
OPTIONS = {"priority": {"priority": "high"}, "ttl": {"ttl_seconds": 7200}, "deps_timeout": {"deps_timeout": 900}, "grace": {"grace_seconds": 300},
           "all": {"priority": "low", "ttl_seconds": 60, "deps_timeout": 30, "grace_seconds": 45}}
SHOWN = {"priority": "priority", "ttl_seconds": "ttl", "deps_timeout": "deps_timeout", "grace_seconds": "grace_seconds"}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_clone_of_a_cluster_job_carries_its_options_and_resubmitted_builds_the_same_trainjob(alb, monkeypatch, tmp_path, option):  # noqa: F811  (the fixtures imported above)
    c, created = alb
    original = objects.build(_request("vision", **OPTIONS[option]), collect(_code(tmp_path)))
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original, FACTS))
    page = c.get("/submit?clone=proj")
    fields = dict(read_form(page.text).fields)
    for key, value in OPTIONS[option].items():  # each in a field the user sees and may change
        assert fields[SHOWN[key]] == str(value) and read_form(page.text).controls[SHOWN[key]].get("type") != "hidden", key
    r = c.post("/submit", data=_resubmitted(read_form(page.text).fields, "proj"), follow_redirects=False)
    assert r.status_code == 303, r.text
    (spec, parts), = created
    assert _built(spec, parts, local_run=False) == original


@pytest.mark.parametrize("option", ["priority", "deps_timeout", "grace"])
def test_a_clone_of_a_local_job_carries_its_options_and_resubmitted_builds_the_same_trainjob(ui, tmp_path, option):  # noqa: F811  (the fixtures imported above)
    c, created = ui
    original = objects.build(_request("local", nodes=1, local=True, image=None, **OPTIONS[option]), collect(_code(tmp_path)))
    d = local.job_dir("proj")
    d.mkdir(parents=True)
    (d / "objects.yaml").write_text(yaml.safe_dump_all(list(original), sort_keys=False))
    page = c.get("/submit?clone=proj").text
    assert 'name="ttl"' not in page  # a local job has no TTL (trainctl submit --local refuses --ttl)
    r = c.post("/submit", data=_resubmitted(read_form(page).fields, "proj"), follow_redirects=False)
    assert r.status_code == 303, r.text
    (spec, parts), = created
    assert _built(spec, parts, local_run=True) == original


def test_the_priority_is_a_select_of_the_platforms_priorities_with_kueue_and_carried_without(alb, monkeypatch, tmp_path):  # noqa: F811  (the fixtures imported above)
    c, _ = alb
    original = objects.build(_request("vision", priority="high"), collect(_code(tmp_path)))
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original, {**FACTS, "priorities": ["normal", "high"], "defaultPriority": "high"}))
    page = c.get("/submit").text
    select = page.split('<select name="priority"', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'<option value="([^"]*)"', select) == ["", "normal", "high"] and "default (high)" in select
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original, {**FACTS, "kueue": False, "priorities": []}))
    page = c.get("/submit?clone=proj").text
    assert "<select" not in page and read_form(page).controls["priority"]["type"] == "hidden" and dict(read_form(page).fields)["priority"] == "high"
    assert "Priority high is carried" in page


def test_each_option_is_judged_by_trainctls_rules_one_problem_per_field(alb):  # noqa: F811  (the fixtures imported above)
    c, created = alb
    r = _post(c, c.get("/submit").text, priority="urgent", ttl="soon", grace_seconds="5", deps_timeout="5")
    assert r.status_code == 422 and not created
    found = _problems(r.text)
    assert {k: len(v) for k, v in found.items()} == {"priority": 1, "ttl_seconds_after_finished": 1, "config.grace_seconds": 1, "deps_timeout": 1}
    req = objects.Request(namespace="vision", nodes=1, command=["x"], priority="urgent", grace_seconds=5, deps_timeout=5)
    lines = objects.problems(req) + objects.ttl_flag("soon")[1]
    for field, flag in (("priority", "--priority"), ("config.grace_seconds", "--grace-seconds"), ("deps_timeout", "--deps-timeout"), ("ttl_seconds_after_finished", "--ttl")):
        assert any(line.startswith(flag) and found[field][0] in line for line in lines), (field, found[field])
    controls = read_form(r.text).controls
    for target in ("priority", "ttl", "grace_seconds", "deps_timeout"):
        assert controls[target].get("aria-invalid") == "true", target
    assert 'id="advanced" open' in r.text  # the advanced fields with a problem are shown
    r = _post(c, c.get("/submit").text, ttl="1h30m", grace_seconds="300", deps_timeout="900", priority="low")
    assert r.status_code == 303
    (spec, _), = created
    assert (spec.ttl_seconds, spec.grace_seconds, spec.deps_timeout, spec.priority) == (5400, "300", "900", "low")


def test_the_api_takes_the_options_strictly_and_refuses_an_empty_program(alb, monkeypatch):  # noqa: F811  (the fixtures imported above)
    c, created = alb
    monkeypatch.setattr(service.Portal, "create", lambda self, caller, spec, parts: created.append((spec, parts)) or {"trainjob": "j", "namespace": spec.namespace, "instanceType": "g5.xlarge"})
    body = {"namespace": "vision", "framework": "pytorch", "training_code": "import torch\nimport torch.nn as nn\n", "config": {"num_nodes": 1, "gpu_per_node": 1}}
    headers = {"content-type": "application/json"}
    r = c.post("/api/trainjob/create", json={**body, "priority": "high", "grace_seconds": 300, "deps_timeout": 900}, headers=headers)
    assert r.status_code == 200, r.text
    (spec, _), = created
    assert (spec.priority, spec.grace_seconds, spec.deps_timeout) == ("high", 300, 900)
    r = c.post("/api/trainjob/create", json={**body, "priority": "urgent", "grace_seconds": 5, "deps_timeout": 5}, headers=headers)
    assert r.status_code == 422 and sorted(p["field"] for p in r.json()["problems"]) == ["config.grace_seconds", "deps_timeout", "priority"]
    r = c.post("/api/trainjob/create", json={**body, "grace_seconds": "300"}, headers=headers)
    assert r.status_code == 422  # strict: a number, not a string
    for empty in ("", " \n"):
        r = c.post("/api/trainjob/create", json={**body, "training_code": empty}, headers=headers)
        assert r.status_code == 422 and [p["field"] for p in r.json()["problems"]] == ["training_code"], r.text
    assert len(created) == 1


def test_a_refused_post_keeps_every_fields_value(alb, monkeypatch, tmp_path):  # noqa: F811  (the fixtures imported above)
    c, created = alb
    original = objects.build(_request("vision"), collect(_code(tmp_path)))
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original, FACTS))
    fields = dict(read_form(c.get("/submit?clone=proj").text).fields)
    # every choice away from the fields it leaves unused: those stay as they were typed
    fields.update(preset="small", gpu_per_node="3", cpu_per_node="7", memory_per_node="40", instance_type="g5.12xlarge", image_choice="builtin", image="registry.example/me:1",
                  code_source="upload", training_code="print('mine')\r\n", requirements="numpy\r\n", env="A=1", secret_env="B=s/k", name="mine", command="python train.py --x 1",
                  num_nodes="3", priority="low", ttl="2h", grace_seconds="300", deps_timeout="900")
    r = c.post("/submit", data=fields, follow_redirects=False)  # refused: "upload" with no files
    assert r.status_code == 422 and not created and list(_problems(r.text)) == ["files"]
    assert dict(read_form(r.text).fields) == {k: v for k, v in fields.items()}


def test_presets_no_gpu_pool_runs_are_disabled_with_the_reason(alb, ui, monkeypatch, tmp_path):  # noqa: F811  (the fixtures imported above)
    c, created = alb
    original = objects.build(_request("vision"), collect(_code(tmp_path)))
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original, FACTS))
    page = c.get("/submit").text
    controls = read_form(page).controls
    assert [k for k in ("preset-small", "preset-medium", "preset-large", "preset-custom") if "disabled" in controls[k]] == ["preset-medium", "preset-large"]
    for key, gpus in (("medium", 2), ("large", 4)):
        assert controls[f"preset-{key}"]["aria-describedby"] == f"preset-{key}-why"
        why = html.unescape(page.split(f'id="preset-{key}-why">', 1)[1].split("</p>", 1)[0])
        assert f"no GPU pool of this cluster gives a worker {gpus} GPUs" in why and "g5.2xlarge" in why and "p4d" not in why  # the EFA pool is not a GPU pool's choice
    # a pool that runs no preset: the new job's form starts on Custom
    monkeypatch.setattr(service.Portal, "kube", lambda self, caller, ns: FakeKube(original, {**FACTS, "pools": [{"name": "gpu-pool", "instanceTypes": ["g5.xlarge"], "efa": False}]}))
    page = c.get("/submit").text
    assert all("disabled" in read_form(page).controls[f"preset-{k}"] for k in ("small", "medium", "large")) and dict(read_form(page).fields)["preset"] == "custom"
    # on this machine, every preset
    lc, _ = ui
    assert not any("disabled" in read_form(lc.get("/submit").text).controls[f"preset-{k}"] for k in form.PRESETS)
