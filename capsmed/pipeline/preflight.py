"""What ``capsmed run`` refuses before anything runs, and ``--dry-run`` checks the same
way: the command line's options, the grid's architectures and model options, the
evaluation splits, the capsmed commands of the data stages and analyses, and the raw
inputs (every missing one on its own line)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline import resources as res
from capsmed.pipeline.spec import Pipeline, RunSpec

SPLITS = ("train", "val", "test", "all")
FLAGS = {"partition": "--slurm-partition", "time_min": "--slurm-time",
         "account": "--slurm-account", "qos": "--slurm-qos",
         "constraint": "--slurm-constraint", "gpus": "--slurm-gpus", "cpus": "--slurm-cpus",
         "mem_gb": "--slurm-mem", "sbatch": "--slurm-option"}


class MissingInputs(CapsmedError):
    """Raw inputs that are not there: one line each (``lines``)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__(" | ".join(lines))
        self.lines = list(lines)


def check_options(retries: int, jobs: int | None, overrides: dict[str, Any]) -> None:
    """The command line's numbers and resource flags."""
    if retries < 0:
        raise CapsmedError(f"--retries must be 0 or more, got {retries}")
    if jobs is not None and jobs < 1:
        raise CapsmedError(f"--jobs must be 1 or more, got {jobs}")
    for key, value in overrides.items():
        try:
            res.check_resources({key: value}, FLAGS.get(key, key), "command line")
        except CapsmedError as exc:  # name the flag, not the resource
            raise CapsmedError(str(exc).replace(f"{FLAGS.get(key, key)}.{key}",
                                                FLAGS.get(key, key))) from None


def check_grid(pipeline: Pipeline, runs: Iterable[RunSpec]) -> None:
    """Every run's architecture and model options exist, and every evaluation names a
    split a dataset file can have (checked once per distinct choice)."""
    from capsmed.models.registry import get_model_entry

    seen: set[tuple[Any, ...]] = set()
    for run in runs:
        arch = str(run.train.get("arch"))
        keys = tuple(sorted(run.train.get("model_kwargs") or {}))
        if (arch, keys) in seen:
            continue
        seen.add((arch, keys))
        try:
            defaults = get_model_entry(arch).defaults()
        except CapsmedError as exc:
            raise CapsmedError(f"{pipeline.path}: run {run.label}: {exc}") from None
        unknown = sorted(set(keys) - set(defaults))
        if unknown:
            raise CapsmedError(f"{pipeline.path}: run {run.label}: architecture '{arch}' "
                               f"has no option(s) {', '.join(unknown)} (options: "
                               f"{', '.join(defaults)})")
        for e in run.evaluations:
            if e.split not in SPLITS:
                raise CapsmedError(f"{pipeline.path}: run {run.label}: evaluation "
                                   f"'{e.name}': split '{e.split}' is not one of "
                                   f"{', '.join(SPLITS)}")


def check_commands(pipeline: Pipeline, commands: set[tuple[str, ...]]) -> None:
    """Each data stage's and analysis' capsmed command exists (``commands``: the
    command paths the CLI knows, e.g. ``("preprocess", "tupac16")``)."""
    wanted = [(f"datasets.{s.name}", c) for s in pipeline.stages.values() for c in s.commands]
    wanted += [(f"analyses.{a.name}", a.command) for a in pipeline.analyses]
    for where, argv in wanted:
        if not any(tuple(argv[:len(c)]) == c for c in commands):
            typed = " ".join(argv[:2])
            close = difflib.get_close_matches(typed, [" ".join(c) for c in commands], 1)
            hint = f" (did you mean 'capsmed {close[0]}'?)" if close else ""
            raise CapsmedError(f"{pipeline.path}: {where}: 'capsmed {typed}' is not a "
                               f"capsmed command{hint}")


def missing_inputs(stages: Iterable[Any], done: Any) -> list[str]:
    """A line per raw input a stage still to make cannot find, with what makes it."""
    missing = []
    for stage in stages:
        if done(stage):
            continue
        for req in stage.requires:
            if not Path(req.path).exists():
                hint = f"; make it with: {req.make}" if req.make else ""
                missing.append(f"{req.path}: not found (data stage '{stage.name}'){hint}")
    return missing
