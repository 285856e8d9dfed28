"""Load stack files (``Pulumi.<stack>.yaml``) strictly: :func:`load_stack_file`. (The running
program reads its config through Pulumi: ``infra/project_config.py``.)"""

from __future__ import annotations

import difflib
import os
from typing import Any

import yaml

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


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<' merges may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: the base class reports it
                continue
            if duplicate:
                raise _DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# A stack file is a few hundred values. YAML aliases let a few lines stand for billions of them
# ("billion laughs"): the composed node graph is measured before anything is built from it.
MAX_ALIASES = 50
MAX_EXPANDED_NODES = 20_000


def _expanded_size(node: yaml.Node) -> tuple[int, int]:
    """(alias uses, nodes after expanding every alias) of a composed document, without expanding:
    a node met again is an alias use, and its size is remembered."""
    sizes: dict[int, int] = {}
    aliases = 0

    def size(n: yaml.Node, depth: int = 0) -> int:
        nonlocal aliases
        if id(n) in sizes:
            aliases += 1
            return sizes[id(n)]
        if depth > 200:  # nesting no config needs (and Python's recursion limit)
            raise StackFileError(f"nested more than 200 levels deep (line {n.start_mark.line + 1})")
        sizes[id(n)] = 1  # a cycle counts once (the constructor refuses recursive structures elsewhere)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(c, depth + 1) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in n.value)
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
            aliases, expanded = _expanded_size(node)
            if aliases > MAX_ALIASES or expanded > MAX_EXPANDED_NODES:
                raise StackFileError(
                    f"{name}: refused before expanding: {aliases} alias uses expanding to {expanded} values (allowed: at most {MAX_ALIASES} aliases and {MAX_EXPANDED_NODES} values)"
                )
        data = loader.construct_document(node) if node is not None else None
    except _DuplicateKeyError as dup:
        raise StackFileError(f"{name}:{dup.line}: duplicate key {str(dup.key)!r}") from None
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
    config_key, config_node = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "config"), (None, None))
    config = data.get("config")
    if config is None or config_key is None or config_node is None:
        return data
    if not isinstance(config, dict):
        raise StackFileError(f"{name}:{config_node.start_mark.line + 1}: 'config' must be a mapping of keys to values, not a {type(config).__name__}")
    for key_node, _ in config_node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str) or ":" not in key:
            continue  # no namespace: Pulumi puts it in the project's
        namespace = key.split(":", 1)[0]
        suggestion = namespace_suggestion(namespace, project)
        if suggestion:
            raise StackFileError(f"{name}:{key_node.start_mark.line + 1}: unknown config namespace {namespace!r} in {key!r}; did you mean {suggestion!r}?")
    return data
