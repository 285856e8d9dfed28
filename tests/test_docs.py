"""The README and Pulumi.yaml stay true to the code."""

import re

import yaml

from config.schema import to_raw
from config.settings import SECTIONS, load_settings
from tests.conftest import PROJECT
from tools import config_docs


def test_readme_config_reference_is_generated_from_the_settings():
    text = (PROJECT / "README.md").read_text()
    assert config_docs.render(text) == text, "run `make docs`"


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
            parsed = to_raw(getattr(s, {"nodeGroups": "node_groups", "gpuPool": "gpu_pool", "smokeChecks": "smoke_checks"}.get(section, section)))
            for k, v in value.items():
                assert parsed[k] == v or isinstance(v, dict), f"{path.name}: {section}.{k}"


def test_readme_names_the_offline_commands():
    text = (PROJECT / "README.md").read_text()
    for cmd in ("make render STACK=dev", "make test", "make emulate", "pulumi up -s dev", "pulumi destroy"):
        assert cmd in text
    assert re.search(r"```mermaid", text)


def test_pulumi_yaml_config_declarations_use_only_what_the_cli_accepts():
    # Pulumi's project schema: a declaration has only type/items/description/secret/default/value,
    # and a type is one of string, integer, boolean, array (structured objects carry no type).
    project = yaml.safe_load((PROJECT / "Pulumi.yaml").read_text())
    for key, decl in project["config"].items():
        assert set(decl) <= {"type", "items", "description", "secret", "default", "value"}, key
        assert decl.get("type", "string") in ("string", "integer", "boolean", "array"), key
    assert set(project) <= {"name", "runtime", "description", "main", "config", "backend", "options", "stackConfigDir", "template", "plugins", "packages", "author", "website", "license"}
