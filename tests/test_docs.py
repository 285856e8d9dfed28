"""The README, docs/ and Pulumi.yaml stay true to the code."""

import re

import yaml

from config import costs
from config.schema import to_raw
from config.settings import SECTIONS, load_settings
from tests.conftest import PROJECT
from tools import config_docs, cost


def test_the_config_reference_is_generated_from_the_settings():
    text = (PROJECT / "docs" / "reference.md").read_text()
    assert config_docs.START in text and config_docs.END in text
    assert config_docs.render(text) == text, "run `make docs`"


def test_the_readme_cost_of_dev_is_what_make_cost_prints():
    text = (PROJECT / "README.md").read_text()
    assert cost.with_block(text, "dev", costs.render(cost.estimate_for("dev"))) == text, "run `make docs`"


def test_every_figure_in_the_readme_is_generated():
    """Numbers in the README's prose go stale: outside the generated cost block and code, the README
    states no counts, timings or prices (those live in docs/ with their dates, or come from a command)."""
    text = (PROJECT / "README.md").read_text()
    start, end = cost.markers("dev")
    prose = text.split(start)[0] + text.split(end)[1]
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)
    prose = re.sub(r"`[^`]*`", "", prose)
    prose = re.sub(r"\[[^\]]*\]\([^)]*\)", "", prose)  # links
    figures = re.findall(r"(?:\$\s?\d[\d.,]*|\b\d[\d.,]*\s?(?:%|s\b|ms\b|min|minutes|hours?|tests|resources|GB/s|GiB|MB|USD))", prose)
    assert figures == [], f"figures in the README that no command checks: {figures}"


def test_readme_links_to_docs_that_exist_or_are_being_written():
    text = (PROJECT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", text))
    missing = sorted(p for p in linked if not (PROJECT / p).exists())
    # the four guides for ML engineers are written beside this README (issue 35)
    assert set(missing) <= {"docs/teams-aws-access.md", "docs/dependencies-and-checkpoints.md", "docs/env-and-secrets.md", "docs/debugging.md"}, missing


def test_pulumi_yaml_declares_exactly_the_config_sections():
    project = yaml.safe_load((PROJECT / "Pulumi.yaml").read_text())
    declared = {k.split(":", 1)[1] for k in project["config"]}
    assert declared == set(SECTIONS)
    for key, decl in project["config"].items():
        assert decl.get("description"), key


def test_every_stack_file_is_valid_config():
    for path in PROJECT.glob("Pulumi.*.yaml"):
        if path.name == "Pulumi.yaml":
            continue
        cfg = yaml.safe_load(path.read_text())["config"]
        raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}
        s = load_settings(raw, stack=path.name.split(".")[1], region=cfg["aws:region"])
        # what was written is what was understood (no silently dropped keys)
        for section, value in raw.items():
            parsed = to_raw(getattr(s, {"nodeGroups": "node_groups", "gpuPool": "gpu_pool", "smokeChecks": "smoke_checks"}.get(section) or str(section)))
            for k, v in value.items():
                assert parsed[k] == v or isinstance(v, dict), f"{path.name}: {section}.{k}"


def test_readme_names_the_offline_commands():
    text = (PROJECT / "README.md").read_text()
    for cmd in ("make render STACK=dev", "make test", "make emulate", "pulumi up -s dev", "pulumi destroy", "make cost STACK=dev", "trainctl submit", "aws eks update-kubeconfig"):
        assert cmd in text
    assert re.search(r"```mermaid", (PROJECT / "docs" / "design.md").read_text())


def test_readme_starts_with_its_readers():
    heads = re.findall(r"^## (.+)$", (PROJECT / "README.md").read_text(), flags=re.M)
    assert heads[:2] == ["For platform engineers: deploy a stack", "For ML engineers: run your training code"]
    assert heads[-1] == "Repository layout" and "Offline: the two commands" in heads


def test_pulumi_yaml_config_declarations_use_only_what_the_cli_accepts():
    # Pulumi's project schema: a declaration has only type/items/description/secret/default/value,
    # and a type is one of string, integer, boolean, array (structured objects carry no type).
    project = yaml.safe_load((PROJECT / "Pulumi.yaml").read_text())
    for key, decl in project["config"].items():
        assert set(decl) <= {"type", "items", "description", "secret", "default", "value"}, key
        assert decl.get("type", "string") in ("string", "integer", "boolean", "array"), key
    assert set(project) <= {"name", "runtime", "description", "main", "config", "backend", "options", "stackConfigDir", "template", "plugins", "packages", "author", "website", "license"}


def test_every_config_key_pulumi_yaml_declares_has_a_default():
    """The engine (pulumi 3.274.1, make engine-build) requires a value for every declared config key
    without a default ("validating stack config: Stack 'dev' is missing configuration values"), and
    every section of ours is optional: each declaration carries default {}."""
    project = yaml.safe_load((PROJECT / "Pulumi.yaml").read_text())
    assert project["config"] and all(decl.get("default") == {} for decl in project["config"].values())
