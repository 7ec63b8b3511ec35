"""``--json``: a command's result as JSON on stdout for scripts (``capsmed runs ls --json
| jq``), with nothing else there: logs, warnings and progress bars go to stderr, and
the command prints no table or closing line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import typer

JSON_HELP = ("Print the result as JSON on stdout, and nothing else there (logs go to "
             "stderr).")


def json_option() -> Any:
    """The ``--json`` flag, the same in every command that has it."""
    return typer.Option(False, "--json", help=JSON_HELP)


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout; an undefined number (NaN, inf) is ``null``,
    as in report.json: JSON has no NaN, and parsers such as jq refuse one."""
    sys.stdout.write(json.dumps(_plain(value), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def print_json_file(path: Path) -> None:
    """The JSON file a command just wrote (report.json, summary.json), as it is."""
    print_json(json.loads(Path(path).read_text(encoding="utf-8")))


def _plain(value: Any) -> Any:
    """``value`` with paths as text, NumPy numbers and arrays as Python ones and
    non-finite floats as None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [_plain(v) for v in items]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # a NumPy scalar or array
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
