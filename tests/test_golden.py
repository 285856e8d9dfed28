"""Rendered Kubernetes objects match the reviewed golden files (update: make golden)."""

from tools import golden


def test_rendered_objects_match_golden_files():
    problems = [p for stack in golden.STACKS for p in golden.diff(stack)]
    assert problems == [], "rendered objects differ from tests/golden (review, then `make golden`):\n" + "\n".join(problems)


def test_resource_urns_are_unchanged():
    """Moving code must not replace deployed resources: every URN of dev and prod stays (a type
    string or parent that changes needs an alias). Update only with a reviewed reason."""
    problems = [p for stack in golden.STACKS for p in golden.urn_diff(stack)]
    assert problems == [], "\n".join(problems)


def test_the_training_programs_are_the_reviewed_ones():
    """A change to workloads/programs/ (a comment too) renames the code ConfigMap and replaces the
    platform's running TrainJobs on the next deploy: it is recorded, so it is never a refactor's side effect."""
    assert golden.code_diff() == []


def test_the_code_record_notices_a_change(tmp_path, monkeypatch):
    record = tmp_path / "code.sha"
    record.write_text("0123456789\n")
    monkeypatch.setattr(golden, "CODE_FILE", record)
    assert golden.code_diff() == [f"the training programs changed (code 0123456789 -> {golden.code_digest()}): every enabled TrainJob of a deployed stack is replaced on its next pulumi up; review, then make golden"]


def test_golden_check_notices_a_change(tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "golden"
    shutil.copytree(golden.GOLDEN_DIR, copy)
    pool = copy / "dev" / "nodepool-gpu-pool.yaml"
    pool.write_text(pool.read_text().replace("NoSchedule", "PreferNoSchedule"))
    monkeypatch.setattr(golden, "GOLDEN_DIR", copy)
    assert golden.diff("dev") == ["dev: nodepool-gpu-pool.yaml changed"]
