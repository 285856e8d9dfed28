"""The config a stack's program gets under the mock runtime, as the Pulumi CLI hands it over.

The CLI (pulumi/pulumi sdk/go/common/resource/config) keeps each top-level key's value as text:
a string as it is, any other value as JSON (object.go ``MarshalString``); Go's JSON writes a float
with no fraction as an integer (``2.0`` -> ``2``). A key holding a ``secure:`` value anywhere is a
secret key (map.go ``SecureKeys``). The CLI decrypts those values; offline nothing can, so each
``secure:`` value becomes :data:`config.secrets.OFFLINE_SECRET`, a secret whose value is unknown
here, and the stack file renders as it is.
"""

from __future__ import annotations

import json
import math
from typing import Any

from config.secrets import OFFLINE_SECRET
from config.stack_file import StackFileError, namespaced_config


def _secure(value: Any) -> bool:
    """A Pulumi secure value: a one-key mapping ``{secure: <ciphertext>}`` (object.go isSecureValue)."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("secure"), str)


def _unknown_secrets(value: Any) -> tuple[Any, bool]:
    """``value`` with each secure value replaced by OFFLINE_SECRET, and whether it held one."""
    if _secure(value):
        return OFFLINE_SECRET, True
    if isinstance(value, dict):
        pairs = {k: _unknown_secrets(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(s for _, s in pairs.values())
    if isinstance(value, list):
        items = [_unknown_secrets(v) for v in value]
        return [v for v, _ in items], any(s for _, s in items)
    return value, False


def _go_json(value: Any) -> Any:
    """Floats as Go's encoding/json writes them: one without a fraction as an integer."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _go_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_json(v) for v in value]
    return value


def config_map(project: str, project_file: dict, stack_file: dict) -> tuple[dict[str, str], list[str]]:
    """(config key -> text, secret keys): project defaults from Pulumi.yaml, then the stack file's."""
    config: dict[str, Any] = {}
    for key, decl in (project_file.get("config") or {}).items():
        full = key if ":" in key else f"{project}:{key}"
        if isinstance(decl, dict) and "default" in decl:
            config[full] = decl["default"]
        elif isinstance(decl, dict) and "value" in decl:
            config[full] = decl["value"]
    secret_keys: list[str] = []
    for key, value in namespaced_config(stack_file.get("config") or {}, project).items():
        if _secure(value) and key.startswith(f"{project}:"):
            # a whole section's value unknown: no plan can be made from it
            raise StackFileError(
                f"cannot decrypt the secure value of {key} offline, and the whole section is secure (set with pulumi config set --secret {key}); "
                f"make only its secret keys secure: pulumi config set --secret --path '{key}.<key>'"
            )
        config[key], secure = _unknown_secrets(value)
        if secure:
            secret_keys.append(key)
    # a key given without a value (``portal:``, ``~``, ``null``): Pulumi passes the empty text
    as_strings = {k: v if isinstance(v, str) else "" if v is None else json.dumps(_go_json(v)) for k, v in config.items()}
    return as_strings, secret_keys
