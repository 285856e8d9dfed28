"""Load stack files (``Pulumi.<stack>.yaml``) strictly: :func:`load_stack_file`. (The running
program reads its config through Pulumi: ``infra/project_config.py``.)

The YAML is read as Pulumi's CLI reads it (gopkg.in/yaml.v3: :mod:`config.go_yaml`), and a config
key is named as the CLI names it (:func:`config_key`)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

import yaml

from config.go_yaml import GoYamlLoader, GoYamlRefused
from config.schema import PROJECT

# --- Stack files (Pulumi.<stack>.yaml) read the way the CLI would refuse them -------------------


class StackFileError(ValueError):
    """A stack file that is not what Pulumi would accept; the message is one line, ``file:line: problem``."""


class StackFileMissing(StackFileError, FileNotFoundError):
    """No stack file at the path (also a ``FileNotFoundError`` for callers that catch that)."""


class _DuplicateKeyError(Exception):
    def __init__(self, key: Any, line: int):
        super().__init__(key, line)
        self.key = key
        self.line = line


class _StrictLoader(GoYamlLoader):
    """The CLI's reader (yaml.v3), which refuses a key given twice in one mapping (PyYAML keeps the
    last silently), comparing keys by their text as yaml.v3 does (``1`` and ``"1"`` are one key).
    A key that is not a string is refused here, though the CLI takes one inside a value: it turns
    it into text (``1:`` is the key "1", ``1.30:`` the key "1.3", not as written), which is
    refused as safer, with the text Pulumi would use and the quoted key that keeps what was written."""

    anchor_names: dict[int, str]

    def compose_document(self) -> yaml.Node | None:
        # the composer forgets its anchors after a document; keep their names for messages
        self.get_event()  # DocumentStart
        node = self.compose_node(None, None)  # type: ignore[arg-type]
        self.get_event()  # DocumentEnd
        self.anchor_names = {id(n): name for name, n in self.anchors.items()}
        self.anchors = {}
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<' merges may be overridden
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise GoYamlRefused("a mapping or list as a key; Pulumi takes only string keys", key_node)
            if key_node.value in seen:
                raise _DuplicateKeyError(key_node.value, key_node.start_mark.line + 1)
            seen.add(key_node.value)
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise GoYamlRefused(
                    f"the key {key_node.value} is read as a {_kind(key)}, which Pulumi would turn into the key \"{_go_text(key)}\"; quote it to keep it as written: \"{key_node.value}\"", key_node
                )
        return super().construct_mapping(node, deep=deep)


def _go_text(value: Any) -> str:
    """``value`` as Go's fmt ``%v`` writes it (how Pulumi makes a non-string key text)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))  # %v of a float64 switches to an exponent only from 1e21
    return str(value)


def _kind(value: Any) -> str:
    return "null" if value is None else {bool: "boolean", int: "number", float: "number"}.get(type(value), type(value).__name__)


# A stack file is a few hundred values. YAML aliases let a few lines stand for billions of them
# ("billion laughs"): the composed node graph is measured before anything is built from it.
MAX_ALIASES = 50
MAX_EXPANDED_NODES = 20_000


def _expanded_size(node: yaml.Node, anchors: Mapping[int, str] | None = None) -> tuple[int, int]:
    """(alias uses, nodes after expanding every alias) of a composed document, without expanding:
    a node met again is an alias use, and its size is remembered. A node met again while it is
    still being walked is an alias inside its own anchor's value, which yaml.v3 refuses ("anchor
    'x' value contains itself"); ``anchors`` names the anchored nodes (by ``id``) for that message."""
    sizes: dict[int, int] = {}
    walking: set[int] = set()
    aliases = 0

    def size(n: yaml.Node, depth: int = 0) -> int:
        nonlocal aliases
        if id(n) in walking:  # an alias inside the node it names: yaml.v3 refuses it
            anchor = (anchors or {}).get(id(n))
            raise GoYamlRefused(f"anchor '{anchor}' value contains itself" if anchor else "an anchor's value contains itself", n)
        if id(n) in sizes:
            aliases += 1
            return sizes[id(n)]
        if depth > 200:  # nesting no config needs (and Python's recursion limit)
            raise StackFileError(f"nested more than 200 levels deep (line {n.start_mark.line + 1})")
        walking.add(id(n))
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(c, depth + 1) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in n.value)
        walking.discard(id(n))
        sizes[id(n)] = total
        return total

    total = size(node)
    return aliases, total


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def namespace_suggestion(namespace: str, project: str) -> str | None:
    """The project's name when ``namespace`` looks like a misspelling of it (not for aws:, pulumi:...)."""
    if namespace == project:
        return None
    candidates = {project, project.replace("-", "_"), project.replace("-", "")}
    close = difflib.get_close_matches(namespace.lower(), sorted(candidates), n=1, cutoff=0.8)
    return project if close else None


def load_stack_file(path: str | os.PathLike[str], project: str = PROJECT) -> dict[str, Any]:
    """Read a ``Pulumi.<stack>.yaml``; :class:`StackFileError` (one line naming file and line) when
    it is not YAML, not a mapping (or ``config:`` is not one), repeats a key at any level, or
    puts a key in a namespace that is a misspelling of the project's. Other namespaces
    (``aws:``, ``pulumi:``, ``kubernetes:``...) and keys without a namespace pass through."""
    name = os.path.basename(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise StackFileMissing(f"{name}: no such stack file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise StackFileError(f"{name}: cannot be read: {_one_line(getattr(err, 'strerror', None) or err)}") from None

    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            aliases, expanded = _expanded_size(node, getattr(loader, "anchor_names", {}))
            if aliases > MAX_ALIASES or expanded > MAX_EXPANDED_NODES:
                raise StackFileError(
                    f"{name}: refused before expanding: {aliases} alias uses expanding to {expanded} values (allowed: at most {MAX_ALIASES} aliases and {MAX_EXPANDED_NODES} values)"
                )
        data = loader.construct_document(node) if node is not None else None
    except _DuplicateKeyError as dup:
        raise StackFileError(f"{name}:{dup.line}: duplicate key {str(dup.key)!r}") from None
    except GoYamlRefused as err:
        raise StackFileError(f"{name}:{err.problem_mark.line + 1 if err.problem_mark else '?'}: {_one_line(err.problem)}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = f"{err.problem} ({err.context})" if err.problem and err.context else err.problem or err.context or type(err).__name__
        raise StackFileError(f"{where}: not valid YAML: {_one_line(problem)}") from None
    except yaml.YAMLError as err:
        raise StackFileError(f"{name}: not valid YAML: {_one_line(err)}") from None
    finally:
        loader.dispose()

    if node is None or data is None:
        return {}
    if not isinstance(data, dict):
        raise StackFileError(f"{name}:{node.start_mark.line + 1}: the top level must be a mapping (config:, ...), not a {type(data).__name__}")
    config_name, config_node = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "config"), (None, None))
    config = data.get("config")
    if config is None or config_name is None or config_node is None:
        return data
    if not isinstance(config, dict):
        raise StackFileError(f"{name}:{config_node.start_mark.line + 1}: 'config' must be a mapping of keys to values, not a {type(config).__name__}")
    lines = {key_node.value: key_node.start_mark.line + 1 for key_node, _ in config_node.value}
    for key, line in lines.items():
        if ":" not in key:
            continue  # no namespace: Pulumi puts it in the project's
        namespace = key.split(":", 1)[0]
        suggestion = namespace_suggestion(namespace, project)
        if suggestion:
            raise StackFileError(f"{name}:{line}: unknown config namespace {namespace!r} in {key!r}; did you mean {suggestion!r}?")
    try:
        namespaced_config(config, project)
    except StackFileError as err:
        raise StackFileError(f"{name}:{lines.get(getattr(err, 'key', None), node.start_mark.line + 1)}: {err}") from None
    return data


# --- config keys as the CLI names them ------------------------------------------------------------


class ConfigKeyError(StackFileError):
    """A config key the CLI refuses, or one key given in two forms; ``key`` is the one named last."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


def config_key(key: str, project: str = PROJECT) -> str | None:
    """The full name (``<namespace>:<name>``) the CLI gives a stack file's config key, None where
    it refuses it. Pulumi (sdk/go/common/workspace/loaders.go stackConfigNamespacedWithProject,
    sdk/go/common/resource/config/key.go ParseKey): a key without ``:`` is the project's
    (``portal`` is ``training-platform:portal``); ``<namespace>:<name>`` as it is; the old
    ``<namespace>:config:<name>`` is ``<namespace>:<name>``; any other key is refused."""
    parts = key.split(":")
    if len(parts) == 1:
        return f"{project}:{key}"
    if len(parts) == 2:
        return key
    if len(parts) == 3 and parts[1] == "config" and parts[0] and parts[2]:
        return f"{parts[0]}:{parts[2]}"
    return None


def namespaced_config(config: Mapping[str, Any], project: str = PROJECT) -> dict[str, Any]:
    """``config`` with every key by its full name. The same key in two forms (``portal`` and
    ``training-platform:portal``) is refused: the CLI keeps one of them, whichever its Go map
    iteration (random) puts last (loaders.go, ``modifiedConfig[namespacedKey] = value``; map.go
    ``Map.UnmarshalYAML``, ``newMap[pk] = v``)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in config.items():
        full = config_key(str(key), project)
        if full is None:
            raise ConfigKeyError(f"{str(key)!r} is not a config key; Pulumi takes <namespace>:<name> (or a name alone, in the project's namespace)", str(key))
        if full in given:
            raise ConfigKeyError(
                f"{given[full]!r} and {str(key)!r} are the same config key {full!r}; Pulumi would keep either one (Go's random map order): keep one of them", str(key)
            )
        given[full] = str(key)
        out[full] = value
    return out
