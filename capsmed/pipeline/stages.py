"""A pipeline's data stages (``datasets:``): the capsmed commands that make one ``.h5``
each, the raw inputs they read, and what they should make (for estimates)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsmed.pipeline import resources as res
from capsmed.pipeline.placeholders import as_text, command_args, fail, interpolate

STAGE_KEYS = {"output", "requires", "commands", "scratch", "note", "resources", "expect"}
EXPECT_KEYS = {"image_size", "channels", "splits"}
REQUIRE_KEYS = {"path", "make"}


@dataclass(frozen=True)
class Requirement:
    """A raw input a data stage reads, and the command that would make it."""

    path: Path
    make: str


@dataclass(frozen=True)
class Stage:
    """A data stage: capsmed commands run once to make ``output``."""

    name: str
    output: Path
    commands: tuple[tuple[str, ...], ...]
    requires: tuple[Requirement, ...] = ()
    scratch: tuple[Path, ...] = ()
    resources: dict[str, Any] = field(default_factory=dict)  # checked values
    expect: dict[str, Any] = field(default_factory=dict)  # sizes before it is made


def check_file_name(name: Any, where: str, path: Path) -> None:
    """Refuse a stage or analysis name that is not one file name: its log and record
    (``logs/data-NAME.log``, ``.capsmed-run/stages/NAME.json``) would be written in
    another folder, ``..`` taking them out of the study's."""
    if any(c in str(name) for c in "/\\\0"):
        raise fail(path, f"{where}: the name {str(name)!r} holds a path separator; its "
                   "log and record files are named after it: use another character")


def read_stages(raw: dict[str, Any], names: dict[str, Any], path: Path) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    for name, spec in (raw.get("datasets") or {}).items():
        check_file_name(name, f"datasets.{name}", path)
        if not isinstance(spec, dict) or "output" not in spec:
            raise fail(path, f"datasets.{name}: needs at least 'output' (the .h5 it makes)")
        bad = sorted(set(spec) - STAGE_KEYS)
        if bad:
            raise fail(path, f"datasets.{name}: unknown key(s) {', '.join(bad)}")
        where = f"datasets.{name}"
        for r in spec.get("requires") or []:
            if not isinstance(r, dict) or "path" not in r or set(r) - REQUIRE_KEYS:
                raise fail(path, f"{where}.requires: each entry is {{path: ..., make: ...}}"
                            f", got {r!r}")
        output = Path(as_text(interpolate(spec["output"], names, where, path),
                              f"{where}.output:", path))
        local = {**names, "output": str(output)}
        commands = tuple(command_args(c, local, f"{where}.commands", path)
                         for c in spec.get("commands") or [])
        requires = tuple(Requirement(Path(as_text(interpolate(r["path"], local, where, path),
                                                  f"{where}.requires: path", path)),
                                     str(interpolate(r.get("make", ""), local, where, path)))
                         for r in spec.get("requires") or [])
        scratch = tuple(Path(as_text(interpolate(s, local, where, path),
                                     f"{where}.scratch:", path))
                        for s in spec.get("scratch") or [])
        own = res.check_resources(interpolate(spec.get("resources"), local, where, path),
                                  f"{where}.resources", path)
        expect = _expect(interpolate(spec.get("expect"), local, where, path), where, path)
        same = next((s for s in stages.values() if _same_path(s.output, output)), None)
        if same is not None:  # one would never be made, its runs training on the other's
            raise fail(path, f"{where}.output: {output} is also datasets.{same.name}'s "
                       "output; give each data stage its own file")
        stages[name] = Stage(name, output, commands, requires, scratch, own, expect)
    return stages


def _same_path(a: Path, b: Path) -> bool:
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def _expect(value: Any, where: str, path: Path) -> dict[str, Any]:
    """``expect: {image_size: 28, channels: 1, splits: {train: 55000}}``: what the
    stage will make, for time estimates before it has run."""
    if value is None:
        return {}
    bad = (not isinstance(value, dict) or set(value) - EXPECT_KEYS
           or not isinstance(value.get("splits", {}), dict)
           or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in [
               *(value.get(k, 1) for k in ("image_size", "channels")),
               *value.get("splits", {}).values()]))
    if bad:
        raise fail(path, f"{where}.expect: expected image_size, channels (whole numbers) "
                    f"and splits (split: images), got '{value}'")
    return value
