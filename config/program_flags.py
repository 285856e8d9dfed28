"""What a training program's own command line accepts, read from its source: the
``add_argument`` calls of ``workloads/programs/<program>`` (parsed with :mod:`ast`, never imported:
the programs import torch or TensorFlow), so ``trainjobs.<job>.extraArgs`` is judged by the
parser that will read it, at render time instead of after GPU nodes launched.

argparse's rules applied (Python's ``argparse``, the standard library the programs use):
``--flag value`` and ``--flag=value``; a unique prefix of a long option is accepted
(``allow_abbrev``, on by default); ``store_true``/``store_false``/``count``/``store_const``
actions take no value; ``choices`` given as a literal are checked, ``type=int``/``float`` too.
A check the source does not make knowable (a ``type`` function of the program's own, choices
computed at run time) is left to the program.
"""

from __future__ import annotations

import ast
import difflib
import functools
import pathlib
from dataclasses import dataclass

PROGRAMS_DIR = pathlib.Path(__file__).resolve().parent.parent / "workloads" / "programs"
_NO_VALUE = frozenset({"store_true", "store_false", "count", "store_const", "help", "version"})


@dataclass(frozen=True)
class Flag:
    name: str  # the long option, such as --lr
    takes_value: bool
    choices: tuple[str, ...] | None  # None: not knowable from the source
    kind: type | None  # int or float when the program converts with them


@functools.cache
def program_flags(program: str) -> dict[str, Flag]:
    """The long options of ``workloads/programs/<program>``, by name."""
    tree = ast.parse((PROGRAMS_DIR / program).read_text(encoding="utf-8"))
    flags: dict[str, Flag] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")]
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw.get("action")
        takes_value = not (isinstance(action, ast.Constant) and action.value in _NO_VALUE)
        choices = None
        if isinstance(kw.get("choices"), ast.Tuple | ast.List):
            items = kw["choices"].elts  # type: ignore[attr-defined]
            if all(isinstance(e, ast.Constant) for e in items):
                choices = tuple(str(e.value) for e in items)  # type: ignore[attr-defined]
        typ = kw.get("type")
        kind = {"int": int, "float": float}.get(typ.id) if isinstance(typ, ast.Name) else None
        for name in names:
            flags[name] = Flag(name, takes_value, choices, kind)
    return flags


def _resolve(token: str, flags: dict[str, Flag]) -> tuple[Flag | None, str | None]:
    """The flag a ``--name`` token means (argparse's prefix rule), or why none."""
    if token in flags:
        return flags[token], None
    matches = sorted(f for f in flags if f.startswith(token))
    if len(matches) == 1:
        return flags[matches[0]], None
    if matches:
        return None, f"ambiguous: {token} could be {', '.join(matches)}"
    return None, None


def argument_problems(program: str, args: list[str]) -> list[tuple[int, str]]:
    """(index into ``args``, what is wrong) for each argument the program's parser would refuse.
    The text names flags and the program, never the values (they may hold secrets)."""
    flags = program_flags(program)
    known = ", ".join(sorted(flags))
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(args):
        token, at = args[i], i
        if not token.startswith("--") or token == "--":
            out.append((i, f"{program} takes no positional arguments; allowed: its flags ({known})"))
            i += 1
            continue
        name, has_eq, value = token.partition("=")
        flag, why = _resolve(name, flags)
        if flag is None:
            close = difflib.get_close_matches(name, list(flags), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            out.append((i, f"{why or f'{program} has no flag {name}'}; {hint}allowed: {known}"))
            # its value, if it has one, is not judged again as a positional argument
            i += 2 if not has_eq and i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            continue
        if not flag.takes_value:
            if has_eq:
                out.append((i, f"{flag.name} of {program} takes no value"))
            i += 1
            continue
        if not has_eq:
            if i + 1 >= len(args) or (args[i + 1].startswith("--") and args[i + 1] != "--"):
                out.append((i, f"{flag.name} of {program} needs a value"))
                i += 1
                continue
            value = args[i + 1]
            i += 1
        if flag.choices is not None and value not in flag.choices:
            out.append((at, f"{flag.name} of {program} takes one of: {', '.join(flag.choices)}"))
        elif flag.kind is not None:
            try:
                flag.kind(value)
            except ValueError:
                out.append((at, f"{flag.name} of {program} takes {'an integer' if flag.kind is int else 'a number'}"))
        i += 1
    return out
