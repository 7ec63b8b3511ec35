"""Every ``capsmed`` command written in README.md and docs/ names a real command and
real options, each option that takes a value given one (a number where it is a
number).

The ```bash blocks also run end to end, in order (tests/test_docs_run.py, a slow
test); this one is the cheap net that also covers synopses and the ``capsmed ...``
spans in the prose, where a renamed option would otherwise leave a command in the
docs that no longer runs as written. Commands are read from fenced and indented code
blocks and from inline ``code`` spans that start with ``capsmed``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from capsmed.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`(capsmed [^`]+)`")
# synopsis notation: [optional parts], A|B alternatives, ... repetition, <placeholders>
_SYNOPSIS = re.compile(r"[\[\]]|\.\.\.|\|")


def _code_lines(text: str) -> list[tuple[str, bool]]:
    """(line, whole): a code block's lines are whole commands; an inline span in prose
    may be a fragment (``capsmed train --resume``), so only its names are checked."""
    lines = []
    for body in _FENCE.findall(text):
        lines += [(line, True) for line in body.replace("\\\n", " ").splitlines()]
    outside = _FENCE.sub("", text)
    lines += [(line, True) for line in outside.splitlines() if line.startswith("    ")]
    lines += [(span, False) for span in _INLINE.findall(outside)]
    return lines


def _commands() -> list[tuple[str, str, bool]]:
    found = []
    for doc in DOCS:
        for line, whole in _code_lines(doc.read_text(encoding="utf-8")):
            line = line.strip().removeprefix("$ ")
            line = re.sub(r"^(torchrun .*?-m |python -m )", "", line)
            if line.startswith("capsmed ") and "<" not in line:  # not "capsmed synth <source>"
                found.append((doc.name, line, whole))
    return found


COMMANDS = _commands()


def _resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The (click) command a word list names, and the words after its name. Typer
    vendors click, so its objects are read by their attributes."""
    cmd = typer.main.get_command(app)
    words = list(words)
    while hasattr(cmd, "commands") and words and not words[0].startswith("-"):
        sub = cmd.commands.get(words[0])
        assert sub is not None, f"no command {words[0]!r} under {cmd.name!r}"
        cmd, words = sub, words[1:]
    return cmd, words


def _check(line: str, whole: bool = True) -> None:
    words = shlex.split(_SYNOPSIS.sub(" ", line), comments=True)[1:]
    cmd, rest = _resolve(words)
    options = {name: p for p in cmd.params if p.param_type_name == "option"
               for name in (*p.opts, *p.secondary_opts)}
    for i, word in enumerate(rest):
        if not word.startswith("-") or word == "-":
            continue
        name = word.split("=", 1)[0]
        assert name in options, f"{cmd.name} has no option {name}"
        param = options[name]
        if param.is_flag or "=" in word or (not whole and i + 1 == len(rest)):
            continue
        assert i + 1 < len(rest) and not rest[i + 1].startswith("--"), f"{name}: no value"
        value, kind = rest[i + 1], param.type_descriptor.annotation
        # NAME is a placeholder, $name a shell variable (a loop over seeds)
        if kind in (int, float) and not re.fullmatch(r"[A-Z_]+|\$\{?\w+\}?", value):
            try:
                kind(value)
            except ValueError:
                raise AssertionError(f"{name} {value!r}: not a number") from None

def test_the_docs_have_commands_to_check():
    docs = {doc for doc, _, _ in COMMANDS}
    assert {"README.md", "evaluate.md", "analyze.md", "pipelines.md", "predict.md"} <= docs
    assert len(COMMANDS) > 80


@pytest.mark.parametrize("doc, line, whole", COMMANDS,
                         ids=[f"{d}:{c[:60]}" for d, c, _ in COMMANDS])
def test_a_documented_command_names_real_commands_and_options(doc, line, whole):
    _check(line, whole)


@pytest.mark.parametrize("line, problem", [
    ("capsmed trian --data x.h5", "no command 'trian'"),
    ("capsmed train --data x.h5 --epoch 3", "no option --epoch"),
    ("capsmed train --data x.h5 --epochs three", "not a number"),
    ("capsmed predict run in --out", "--out: no value"),
])
def test_the_check_catches_drift(line, problem):
    with pytest.raises(AssertionError, match=problem):
        _check(line)
