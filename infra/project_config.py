"""The running program's stack config as plain data: the only module that touches pulumi.Config."""

from __future__ import annotations

import json
import os
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config
from pulumi.runtime import mocks as runtime_mocks
from pulumi.runtime import settings as runtime_settings

from config.schema import PROJECT, ConfigError, ConfigErrors
from config.secrets import offline_secret
from config.stack_file import namespace_suggestion


def project_config(project: str = PROJECT) -> dict[str, Any]:
    """All ``<project>:*`` keys (default ``training-platform``; a TrainJob stack's
    ``training-platform-workloads``), structured values decoded, prefix removed.

    Reading the whole map (not key by key) is what lets unknown keys be reported as errors.
    """
    merged: dict[str, Any] = dict(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    raw: dict[str, Any] = {}
    misspelt = []
    for full_key, value in merged.items():
        namespace, _, key = full_key.partition(":")
        if namespace != project:
            # a key meant for this project under a misspelt namespace would be silently ignored
            if namespace_suggestion(namespace, project):
                misspelt.append(ConfigError(full_key, _decode(value), f"unknown config namespace {namespace!r}; did you mean {project!r}?"))
            continue
        raw[key] = _decode(value)
    if misspelt:
        raise ConfigErrors(misspelt) if len(misspelt) > 1 else misspelt[0]
    return raw


def _decode(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "[") or text in ("true", "false", "null") or text.lstrip("-").isdigit():
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                return value
    return value


def secret_config_keys(project: str = PROJECT) -> set[str]:
    """The project's top-level config keys (without the prefix) whose values Pulumi holds as
    secrets: those with a ``secure:`` value anywhere in them (the CLI's config.Map SecureKeys)."""
    keys = runtime_config._SECRET_KEYS.get() | set(runtime_config.get_config_secret_keys_env())
    return {k.partition(":")[2] for k in keys if k.partition(":")[0] == project}


async def _given(value: Any) -> Any:
    return value


def config_secret(value: str) -> pulumi.Output[str]:
    """A config value that is a secret, as a secret Output. Offline, a ``secure:`` value the render
    cannot decrypt (config.secrets.OFFLINE_SECRET) is an unknown secret, as ``pulumi preview``
    shows a value it does not know; the plan masks it."""
    if offline_secret(value) and offline_render():
        return pulumi.Output(set(), _given(None), _given(False), _given(True))
    return pulumi.Output.secret(value)


def aws_region() -> str:
    return pulumi.Config("aws").get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""


def offline_render() -> bool:
    """Whether the program runs under Pulumi's mock runtime (tools/render.py, the tests, the local
    control plane) rather than against a real engine and AWS (``pulumi up`` / ``pulumi preview``)."""
    return isinstance(runtime_settings.get_monitor(), runtime_mocks.MockMonitor)
