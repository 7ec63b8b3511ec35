"""A pipeline file (``pipelines/*.yaml``): read it, fill its variables, expand its grid.

The format is documented in ``docs/pipelines.md``. In short: ``datasets`` are data
stages (capsmed commands that make one ``.h5`` each), ``grid`` blocks are products of
axes (``dataset``, ``arch``, ``seed``, ... and labels such as ``condition``), ``train``
holds every run's options and ``rules`` add options to the runs their ``when``
matches. ``{name}`` in any string is a variable, a grid field of the run, or
``{datasets.NAME}``, the output of a data stage. ``resources`` (top level, in a rule,
a data stage or an analysis) say what each job asks for (:mod:`.resources`); ``claims``
quote the paper's sentences as comparisons over the runs (:mod:`.study_claims`).

Nothing here runs anything; :mod:`capsmed.pipeline.runner` does.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsmed.evaluate.claims import Claim
from capsmed.pipeline import resources as res
from capsmed.pipeline.checks import (
    check_distinct_runs,
    check_report,
    check_selection,
    grid_axes,
    matches_selection,
    run_filter,
)
from capsmed.pipeline.executors import check_executor_section
from capsmed.pipeline.placeholders import as_text, command_args, fail, interpolate
from capsmed.pipeline.stages import Stage, check_file_name, read_stages
from capsmed.pipeline.study_claims import read_claims
from capsmed.pipeline.yamlfile import read_pipeline_yaml
from capsmed.train.config import TrainConfig
from capsmed.yamlfile import load_value

TOP_KEYS = {"name", "description", "paper", "variables", "datasets", "grid", "exclude",
            "train", "rules", "evaluate", "analyses", "report", "claims", "executor",
            "resources"}
EVALUATE_KEYS = {"name", "split", "data", "agreement", "batch_size"}
ANALYSIS_KEYS = {"name", "output", "command", "note", "resources"}
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


@dataclass(frozen=True)
class Evaluation:
    """One ``capsmed evaluate`` of a run: its report folder name and options."""

    name: str = "report"
    split: str = "test"
    data: str | None = None
    agreement: bool = False
    batch_size: int | None = None  # images per forward pass [capsmed evaluate's 512]


@dataclass(frozen=True)
class RunSpec:
    """One training run of the grid (its identity is added by the runner)."""

    fields: dict[str, Any]
    label: str
    train: dict[str, Any]
    evaluations: tuple[Evaluation, ...]
    stage: str | None  # the data stage its ``data`` comes from, if any
    resources: dict[str, Any] = field(default_factory=dict)  # checked, merged values

    def matches(self, selection: Mapping[str, set[str]]) -> bool:
        """Whether every named field has one of the selected values."""
        return all(str(self.fields.get(k)) in values for k, values in selection.items())


@dataclass(frozen=True)
class Analysis:
    """A capsmed command run after the grid (``{runs:FILTER}`` expands to run dirs)."""

    name: str
    output: Path | None  # None: done once its command succeeded (it writes where it says)
    command: tuple[str, ...]
    resources: dict[str, Any] = field(default_factory=dict)  # checked values


@dataclass
class Pipeline:
    """A read, interpolated and expanded pipeline file."""

    path: Path
    name: str
    description: str
    variables: dict[str, Any]
    stages: dict[str, Stage]
    runs: list[RunSpec]
    analyses: list[Analysis]
    report: dict[str, Any]
    executor: dict[str, Any]
    out: Path
    resources: dict[str, Any] = field(default_factory=dict)  # every job's defaults
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    claims: list[Claim] = field(default_factory=list)  # the paper's, checked on the grid


def _variables(raw: dict[str, Any], overrides: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """YAML defaults < environment ``CAPSMED_<NAME>`` < ``--set``; then filled in order."""
    declared = raw.get("variables") or {}
    if not isinstance(declared, dict):
        raise fail(path, "'variables' must be a mapping")
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise fail(path, f"--set: unknown variable(s) {', '.join(unknown)} (the pipeline "
                    f"declares: {', '.join(declared) or 'none'})")
    values: dict[str, Any] = {"name": raw["name"]}
    for key, default in declared.items():
        env = os.environ.get(f"CAPSMED_{key.upper()}")
        value = overrides[key] if key in overrides else (
            load_value(env, f"CAPSMED_{key.upper()}") if env is not None else default)
        values[key] = interpolate(value, values, f"variable '{key}'", path)
    return values


def _fill_selections(raw: dict[str, Any], names: Mapping[str, Any],
                     path: Path) -> dict[str, Any]:
    """``raw`` with the variables filled in the grid, in ``exclude`` and in the rules'
    ``when`` (a run's own fields fill the rest, run by run): ``seed: "{seeds}"`` with
    ``--set seeds=[0]`` is an axis of one value, not the text '{seeds}'."""
    raw = dict(raw)
    for key in ("grid", "exclude"):
        if raw.get(key) is not None:
            raw[key] = interpolate(raw[key], names, key, path)
    if isinstance(raw.get("rules"), list):
        raw["rules"] = [{**rule, "when": interpolate(rule["when"], names,
                                                      f"rules[{i}].when", path)}
                        if isinstance(rule, dict) and rule.get("when") is not None else rule
                        for i, rule in enumerate(raw["rules"])]
    return raw


def _combinations(raw: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    blocks = raw.get("grid")
    if isinstance(blocks, dict):
        blocks = [blocks]
    if not blocks:
        raise fail(path, "'grid' is empty: nothing to run")
    seen, combos = set(), []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not block:
            raise fail(path, f"grid block {i + 1}: expected a mapping of axis: [values]")
        axes = [(k, v if isinstance(v, list) else [v]) for k, v in block.items()]
        empty = [k for k, v in axes if not v]
        if empty:  # the product of an empty axis is no run: the block would vanish
            raise fail(path, f"grid block {i + 1}: axis '{empty[0]}' has no values (the "
                        "block would make no run); give values or remove the axis")
        for values in itertools.product(*(v for _, v in axes)):
            combo = dict(zip((k for k, _ in axes), values, strict=True))
            key = tuple(sorted((k, str(v)) for k, v in combo.items()))
            if key not in seen:
                seen.add(key)
                combos.append(combo)
    return combos


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """Merge ``extra`` into ``into``; nested mappings (``model_kwargs``) merge too."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def run_label(fields: Mapping[str, Any]) -> str:
    """``mnist-capsnet-f10-seed0``: string fields as they are, numbers with their name."""
    parts = [str(v) if isinstance(v, str) else f"{k}{v}" for k, v in fields.items()]
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", "-".join(parts))


def _evaluations(items: Any, where: str, path: Path) -> tuple[Evaluation, ...]:
    items = items if items is not None else [{}]
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) - EVALUATE_KEYS:
            raise fail(path, f"{where}: each evaluation is a mapping of "
                        f"{', '.join(sorted(EVALUATE_KEYS))}")
        bad = [k for k, kind in (("agreement", bool), ("batch_size", int))
               if item.get(k) is not None
               and (not isinstance(item[k], kind) or isinstance(item[k], bool) != (kind is bool))]
        if bad:  # agreement: "no" would be a true string: the Agr evaluation, unasked
            raise fail(path, f"{where}: {bad[0]} must be "
                        f"{'true or false' if bad[0] == 'agreement' else 'an integer'}, "
                        f"got '{item[bad[0]]}'")
        out.append(Evaluation(**item))
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise fail(path, f"{where}: evaluation names must differ (got {names})")
    return tuple(out)


def _check_rules(raw: dict[str, Any], axes: Mapping[str, list[str]],
                 combos: list[dict[str, Any]], path: Path) -> None:
    """A misspelt field or value in ``when`` or ``exclude``, or a combination of fields
    no grid point has, would match nothing: the rule or exclusion would do nothing."""
    excluded = raw.get("exclude") or []
    if not isinstance(excluded, list):
        raise fail(path, "'exclude' must be a list of {field: value(s)}")
    for i, item in enumerate(excluded):
        check_selection(item, axes, f"exclude[{i}]", path)
        if not item:  # all of no fields match: every run would be dropped
            raise fail(path, f"exclude[{i}]: empty; name the field(s) of the runs to drop")
        if not any(matches_selection(item, c) for c in combos):
            raise fail(path, f"exclude[{i}]: {item} matches no run of the grid (no grid "
                        "point has that combination)")
    kept = [c for c in combos if not any(matches_selection(x, c) for x in excluded)]
    for i, rule in enumerate(raw.get("rules") or []):
        if not isinstance(rule, dict) or set(rule) - {"when", "set", "resources"} \
                or not ({"set", "resources"} & set(rule)) \
                or not isinstance(rule.get("set", {}), dict):
            raise fail(path, f"rules[{i}]: expected 'when' (optional) and 'set' (a mapping) "
                        "and/or 'resources'")
        check_selection(rule.get("when") or {}, axes, f"rules[{i}].when", path)
        if rule.get("when") and not any(matches_selection(rule["when"], c) for c in kept):
            raise fail(path, f"rules[{i}].when: {rule['when']} matches no run of the grid "
                        "(no grid point left after 'exclude' has that combination)")


def _grid_options(fields: Mapping[str, Any], stages: dict[str, Stage]) -> dict[str, Any]:
    """The options a grid point sets: its train-option axes, and ``data`` when its
    ``dataset`` names a data stage (over ``train.data``: the axis is what varies)."""
    opts = {k: v for k, v in fields.items() if k in TRAIN_FIELDS}
    if fields.get("dataset") in stages:
        opts["data"] = str(stages[fields["dataset"]].output)
    return opts


def _runs(raw: dict[str, Any], names: dict[str, Any], stages: dict[str, Stage],
          combos: list[dict[str, Any]], path: Path) -> list[RunSpec]:
    rules = raw.get("rules") or []
    defaults = res.check_resources(interpolate(raw.get("resources"), names, "resources",
                                               path), "resources", path)
    runs = []
    for fields in combos:
        if any(matches_selection(x, fields) for x in raw.get("exclude") or []):
            continue
        label = run_label(fields)
        opts: dict[str, Any] = copy.deepcopy(raw.get("train") or {})
        from_grid = _grid_options(fields, stages)
        opts.update(from_grid)
        stage = fields.get("dataset") if fields.get("dataset") in stages else None
        local = {**names, **{k: v for k, v in fields.items()}}
        resources = dict(defaults)
        for i, rule in enumerate(rules):
            if matches_selection(rule.get("when") or {}, fields):
                clash = sorted(set(rule.get("set") or {}) & set(from_grid))
                if clash:
                    raise fail(path, f"rules[{i}] sets {', '.join(clash)}, which the grid "
                                f"sets for run {label}: the rule would override the axis "
                                "(give the values on the grid, or rename the axis)")
                _merge(opts, rule.get("set") or {})
                resources = res.merge(resources, res.check_resources(
                    interpolate(rule.get("resources"), local, f"rules[{i}]", path),
                    f"rules[{i}].resources", path))
        opts = interpolate(opts, local, f"run {label}", path)
        evaluations = _evaluations(interpolate(opts.pop("evaluate", raw.get("evaluate")),
                                               local, f"run {label}", path),
                                   f"run {label}: evaluate", path)
        TrainConfig.from_dict({**opts, "out": None}, f"{path}: run {label}")  # validates
        res.build(resources, f"run {label}: resources", path)  # its shape is checked
        runs.append(RunSpec(fields, label, opts, evaluations, stage, resources))
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise fail(path, "two grid combinations give the same run label")
    check_distinct_runs(runs, path, sorted(TRAIN_FIELDS))
    return runs


def _analyses(raw: dict[str, Any], names: dict[str, Any], runs: list[RunSpec],
              axes: Mapping[str, list[str]], path: Path) -> list[Analysis]:
    out: list[Analysis] = []
    for i, spec in enumerate(raw.get("analyses") or []):
        if not isinstance(spec, dict) or set(spec) - ANALYSIS_KEYS or not {
                "name", "command"} <= set(spec):
            raise fail(path, f"analyses[{i}]: needs name and command (output optional)")
        where = f"analyses.{spec['name']}"
        check_file_name(spec["name"], where, path)
        output = (Path(as_text(interpolate(spec["output"], names, where, path),
                               f"{where}.output:", path)) if spec.get("output") else None)
        local = {**names, "output": str(output)}
        # {runs:FILTER} stays a placeholder here: the runner expands it to run dirs
        keep = {m: m for m in re.findall(r"\{(runs:[^}]*)\}", " ".join(map(str, spec["command"])))}
        command = command_args(spec["command"], {**local, **{k: "{" + k + "}" for k in keep}},
                               f"{where}.command", path)
        for arg in command:
            _check_run_filter(arg, runs, axes, where, path)
        if any(a.name == str(spec["name"]) for a in out):
            raise fail(path, f"{where}: two analyses have this name (their records would mix)")
        own = res.check_resources(interpolate(spec.get("resources"), local, where, path),
                                  f"{where}.resources", path)
        out.append(Analysis(str(spec["name"]), output, command, own))
    return out


def _check_run_filter(arg: str, runs: list[RunSpec], axes: Mapping[str, list[str]],
                      where: str, path: Path) -> None:
    """An analysis over no run (a misspelt filter) would be skipped, not run."""
    selection = run_filter(arg)
    if selection is None:
        if "{runs:" in arg:
            raise fail(path, f"{where}: {arg}: a {{runs:...}} filter must be a whole "
                        "argument")
        return
    check_selection(selection, axes, f"{where}: {arg}", path)
    if not any(r.matches(selection) for r in runs):
        raise fail(path, f"{where}: {arg} matches no run of the grid")


def load_pipeline(path: Path, overrides: Mapping[str, Any] | None = None) -> Pipeline:
    """Read and expand ``path``; ``overrides`` are ``--set`` variables."""
    path = Path(path)
    raw = read_pipeline_yaml(path)
    if not isinstance(raw, dict) or not raw.get("name"):
        raise fail(path, "a pipeline is a mapping with at least 'name' and 'grid'")
    bad = sorted(set(raw) - TOP_KEYS)
    if bad:
        raise fail(path, f"unknown key(s) {', '.join(bad)} (allowed: "
                    f"{', '.join(sorted(TOP_KEYS))})")
    for key in ("executor", "train"):
        if not isinstance(raw.get(key) or {}, dict):
            raise fail(path, f"'{key}' must be a mapping")
    check_executor_section(raw.get("executor") or {}, path)
    names = _variables(raw, overrides or {}, path)
    if "out" in names and names["out"] in (None, ""):  # --set out=$UNSET: not ./None
        raise fail(path, "variable 'out' is empty: give the output folder (--set out=DIR)")
    # absolute, so Slurm jobs and child processes find it from any working directory
    out = Path(str(names.get("out", f"runs/{raw['name']}"))).absolute()
    names["out"] = str(out)
    stages = read_stages(raw, names, path)
    names.update({f"datasets.{k}": str(s.output) for k, s in stages.items()})
    raw = _fill_selections(raw, names, path)
    combos = _combinations(raw, path)
    axes = grid_axes(combos)
    _check_rules(raw, axes, combos, path)
    runs = _runs(raw, names, stages, combos, path)
    check_report(raw.get("report") or {}, runs, axes, path)
    claims = read_claims(raw.get("claims"), axes, runs, path)
    return Pipeline(path=path, name=str(raw["name"]), description=str(raw.get("description",
                    "")).strip(), variables=names, stages=stages,
                    runs=runs, analyses=_analyses(raw, names, runs, axes, path),
                    report=raw.get("report") or {},
                    executor=interpolate(raw.get("executor") or {}, names, "executor", path),
                    out=out, raw=raw, resources=res.check_resources(
                        interpolate(raw.get("resources"), names, "resources", path),
                        "resources", path), claims=claims)
