"""``{name}`` placeholders in a pipeline file, and its one-line errors."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError

PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.:=,+-]*)\}")


def fail(path: Path, message: str) -> CapsmedError:
    return CapsmedError(f"{path}: {message}")


def interpolate(value: Any, names: Mapping[str, Any], where: str, path: Path) -> Any:
    """Fill ``{name}`` placeholders; a string that is one placeholder keeps its type."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            return _lookup(whole.group(1), names, where, path)
        return PLACEHOLDER.sub(lambda m: _text(m.group(1), value, names, where, path), value)
    if isinstance(value, list):
        return [interpolate(v, names, where, path) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, names, where, path) for k, v in value.items()}
    return value


def command_args(command: Any, names: Mapping[str, Any], where: str, path: Path
                 ) -> tuple[str, ...]:
    """A command of a data stage or an analysis, filled: each argument text or a number.
    ``str()`` made YAML ``null`` the word None, ``true`` True and ``[10, 12]`` one
    argument '[10, 12]', all passed on to the command."""
    if not isinstance(command, list):
        raise fail(path, f"{where}: a command is a list of arguments, got {command!r}")
    return tuple(as_text(interpolate(arg, names, where, path), f"{where}: command argument",
                         path) for arg in command)


def as_text(value: Any, where: str, path: Path) -> str:
    """``value`` (filled) as the text of an argument or a path; YAML ``null``, true/false,
    a list or a mapping refused: ``str()`` made them 'None' ('{out}/raw' with a null
    ``{raw}`` as scratch was the folder ./None, removed before the stage ran)."""
    if value is None or isinstance(value, bool | list | dict):
        raise fail(path, f"{where} {value!r} is not text or a number (it would be "
                   f"used as '{value}'); quote it, or give the value")
    return str(value)


def _text(name: str, text: str, names: Mapping[str, Any], where: str, path: Path) -> str:
    """A placeholder inside a longer string: a null (``--set out=`` of an unset shell
    variable) would become the word None in a path or an option."""
    value = _lookup(name, names, where, path)
    if value is None:
        raise fail(path, f"{where}: '{text}': '{{{name}}}' is null (empty) and would be "
                   "written as None; give it a value")
    return str(value)


def _lookup(name: str, names: Mapping[str, Any], where: str, path: Path) -> Any:
    if name not in names:
        known = ", ".join(sorted(k for k in names if not k.startswith("runs:")))
        raise fail(path, f"{where}: unknown variable '{{{name}}}' (known: {known})")
    return names[name]
