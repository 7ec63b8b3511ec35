"""A pipeline file (``pipelines/*.yaml``): read it, fill its variables, expand its grid.

The format is documented in ``docs/pipelines.md``. In short: ``datasets`` are data
stages (capsmed commands that make one ``.h5`` each), ``grid`` blocks are products of
axes (``dataset``, ``arch``, ``seed``, ... and labels such as ``condition``), ``train``
holds every run's options and ``rules`` add options to the runs their ``when``
matches. ``{name}`` in any string is a variable, a grid field of the run, or
``{datasets.NAME}``, the output of a data stage.

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

import yaml

from capsmed.errors import CapsmedError
from capsmed.train.config import TrainConfig

TOP_KEYS = {"name", "description", "paper", "variables", "datasets", "grid", "exclude",
            "train", "rules", "evaluate", "analyses", "report", "executor"}
STAGE_KEYS = {"output", "requires", "commands", "scratch", "note"}
EVALUATE_KEYS = {"name", "split", "data", "agreement", "batch_size"}
ANALYSIS_KEYS = {"name", "output", "command", "note"}
TABLE_KEYS = {"title", "kind", "where", "rows", "columns", "metric", "evaluation", "paper",
              "scale", "note", "file", "key"}
PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w.:=,+-]*)\}")
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


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

    def matches(self, selection: Mapping[str, set[str]]) -> bool:
        """Whether every named field has one of the selected values."""
        return all(str(self.fields.get(k)) in values for k, values in selection.items())


@dataclass(frozen=True)
class Analysis:
    """A capsmed command run after the grid (``{runs:FILTER}`` expands to run dirs)."""

    name: str
    output: Path | None  # None: done once its command succeeded (it writes where it says)
    command: tuple[str, ...]


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
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


def _fail(path: Path, message: str) -> CapsmedError:
    return CapsmedError(f"{path}: {message}")


def interpolate(value: Any, names: Mapping[str, Any], where: str, path: Path) -> Any:
    """Fill ``{name}`` placeholders; a string that is one placeholder keeps its type."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            return _lookup(whole.group(1), names, where, path)
        return PLACEHOLDER.sub(lambda m: str(_lookup(m.group(1), names, where, path)), value)
    if isinstance(value, list):
        return [interpolate(v, names, where, path) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, names, where, path) for k, v in value.items()}
    return value


def _lookup(name: str, names: Mapping[str, Any], where: str, path: Path) -> Any:
    if name not in names:
        known = ", ".join(sorted(k for k in names if not k.startswith("runs:")))
        raise _fail(path, f"{where}: unknown variable '{{{name}}}' (known: {known})")
    return names[name]


def parse_selection(items: list[str] | None, option: str) -> dict[str, set[str]]:
    """``["arch=capsnet,dataset=mnist", "seed=0"]`` -> ``{"arch": {"capsnet"}, ...}``;
    a field given twice keeps either value."""
    out: dict[str, set[str]] = {}
    for item in items or []:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise CapsmedError(f"{option} expects FIELD=VALUE[,FIELD=VALUE], got '{pair}'")
            out.setdefault(key.strip(), set()).add(value.strip())
    return out


def _variables(raw: dict[str, Any], overrides: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """YAML defaults < environment ``CAPSMED_<NAME>`` < ``--set``; then filled in order."""
    declared = raw.get("variables") or {}
    if not isinstance(declared, dict):
        raise _fail(path, "'variables' must be a mapping")
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise _fail(path, f"--set: unknown variable(s) {', '.join(unknown)} (the pipeline "
                    f"declares: {', '.join(declared) or 'none'})")
    values: dict[str, Any] = {"name": raw["name"]}
    for key, default in declared.items():
        env = os.environ.get(f"CAPSMED_{key.upper()}")
        value = overrides[key] if key in overrides else (
            yaml.safe_load(env) if env is not None else default)
        values[key] = interpolate(value, values, f"variable '{key}'", path)
    return values


def _stages(raw: dict[str, Any], names: dict[str, Any], path: Path) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    for name, spec in (raw.get("datasets") or {}).items():
        if not isinstance(spec, dict) or "output" not in spec:
            raise _fail(path, f"datasets.{name}: needs at least 'output' (the .h5 it makes)")
        bad = sorted(set(spec) - STAGE_KEYS)
        if bad:
            raise _fail(path, f"datasets.{name}: unknown key(s) {', '.join(bad)}")
        where = f"datasets.{name}"
        output = Path(str(interpolate(spec["output"], names, where, path)))
        local = {**names, "output": str(output)}
        commands = tuple(tuple(str(a) for a in interpolate(c, local, where, path))
                         for c in spec.get("commands") or [])
        requires = tuple(Requirement(Path(str(interpolate(r["path"], local, where, path))),
                                     str(interpolate(r.get("make", ""), local, where, path)))
                         for r in spec.get("requires") or [])
        scratch = tuple(Path(str(interpolate(s, local, where, path)))
                        for s in spec.get("scratch") or [])
        stages[name] = Stage(name, output, commands, requires, scratch)
    return stages


def _combinations(raw: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    blocks = raw.get("grid")
    if isinstance(blocks, dict):
        blocks = [blocks]
    if not blocks:
        raise _fail(path, "'grid' is empty: nothing to run")
    seen, combos = set(), []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not block:
            raise _fail(path, f"grid block {i + 1}: expected a mapping of axis: [values]")
        axes = [(k, v if isinstance(v, list) else [v]) for k, v in block.items()]
        for values in itertools.product(*(v for _, v in axes)):
            combo = dict(zip((k for k, _ in axes), values, strict=True))
            key = tuple(sorted((k, str(v)) for k, v in combo.items()))
            if key not in seen:
                seen.add(key)
                combos.append(combo)
    return combos


def _matches(when: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    for key, wanted in when.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        if str(fields.get(key)) not in {str(o) for o in options}:
            return False
    return True


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
            raise _fail(path, f"{where}: each evaluation is a mapping of "
                        f"{', '.join(sorted(EVALUATE_KEYS))}")
        out.append(Evaluation(**item))
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise _fail(path, f"{where}: evaluation names must differ (got {names})")
    return tuple(out)


def _runs(raw: dict[str, Any], names: dict[str, Any], stages: dict[str, Stage],
          path: Path) -> list[RunSpec]:
    excluded = raw.get("exclude") or []
    rules = raw.get("rules") or []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or set(rule) - {"when", "set"} or "set" not in rule:
            raise _fail(path, f"rules[{i}]: expected 'when' (optional) and 'set'")
    runs = []
    for fields in _combinations(raw, path):
        if any(_matches(x, fields) for x in excluded):
            continue
        label = run_label(fields)
        opts: dict[str, Any] = copy.deepcopy(raw.get("train") or {})
        opts.update({k: v for k, v in fields.items() if k in TRAIN_FIELDS})
        stage = fields.get("dataset") if fields.get("dataset") in stages else None
        if stage is not None:
            opts.setdefault("data", str(stages[stage].output))
        for rule in rules:
            if _matches(rule.get("when") or {}, fields):
                _merge(opts, rule["set"])
        local = {**names, **{k: v for k, v in fields.items()}}
        opts = interpolate(opts, local, f"run {label}", path)
        evaluations = _evaluations(interpolate(opts.pop("evaluate", raw.get("evaluate")),
                                               local, f"run {label}", path),
                                   f"run {label}: evaluate", path)
        TrainConfig.from_dict({**opts, "out": None}, f"{path}: run {label}")  # validates
        runs.append(RunSpec(fields, label, opts, evaluations, stage))
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise _fail(path, "two grid combinations give the same run label")
    return runs


def _analyses(raw: dict[str, Any], names: dict[str, Any], path: Path) -> list[Analysis]:
    out = []
    for i, spec in enumerate(raw.get("analyses") or []):
        if not isinstance(spec, dict) or set(spec) - ANALYSIS_KEYS or not {
                "name", "command"} <= set(spec):
            raise _fail(path, f"analyses[{i}]: needs name and command (output optional)")
        where = f"analyses.{spec['name']}"
        output = (Path(str(interpolate(spec["output"], names, where, path)))
                  if spec.get("output") else None)
        local = {**names, "output": str(output)}
        # {runs:FILTER} stays a placeholder here: the runner expands it to run dirs
        keep = {m: m for m in re.findall(r"\{(runs:[^}]*)\}", " ".join(map(str, spec["command"])))}
        command = tuple(str(interpolate(a, {**local, **{k: "{" + k + "}" for k in keep}},
                                        where, path)) for a in spec["command"])
        out.append(Analysis(str(spec["name"]), output, command))
    return out


def _check_report(report: Any, fields: set[str], path: Path) -> None:
    """Table specs are checked when the file is read, not hours later at the end."""
    if not isinstance(report, dict):
        raise _fail(path, "'report' must be a mapping")
    for i, spec in enumerate(report.get("tables") or []):
        where = f"report.tables[{i}]"
        if not isinstance(spec, dict):
            raise _fail(path, f"{where}: expected a mapping")
        bad = sorted(set(spec) - TABLE_KEYS)
        if bad:
            raise _fail(path, f"{where}: unknown key(s) {', '.join(bad)} (allowed: "
                        f"{', '.join(sorted(TABLE_KEYS))})")
        kind = spec.get("kind", "metric")
        if kind not in ("metric", "per_class"):
            raise _fail(path, f"{where}: kind must be metric or per_class, got '{kind}'")
        needed = ("rows", "columns") if kind == "metric" else ()
        for key in needed:
            if spec.get(key) not in fields:
                known = ", ".join(sorted(fields))
                raise _fail(path, f"{where}: {key} must be a grid field ({known}), got "
                            f"'{spec.get(key)}'")
        unknown = sorted(set(spec.get("where") or {}) - fields)
        if unknown:
            raise _fail(path, f"{where}: 'where' names unknown field(s) {', '.join(unknown)}")


def load_pipeline(path: Path, overrides: Mapping[str, Any] | None = None) -> Pipeline:
    """Read and expand ``path``; ``overrides`` are ``--set`` variables."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(path, f"cannot read pipeline ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise _fail(path, f"not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(raw, dict) or not raw.get("name"):
        raise _fail(path, "a pipeline is a mapping with at least 'name' and 'grid'")
    bad = sorted(set(raw) - TOP_KEYS)
    if bad:
        raise _fail(path, f"unknown key(s) {', '.join(bad)} (allowed: "
                    f"{', '.join(sorted(TOP_KEYS))})")
    names = _variables(raw, overrides or {}, path)
    # absolute, so Slurm jobs and child processes find it from any working directory
    out = Path(str(names.get("out", f"runs/{raw['name']}"))).absolute()
    names["out"] = str(out)
    stages = _stages(raw, names, path)
    names.update({f"datasets.{k}": str(s.output) for k, s in stages.items()})
    runs = _runs(raw, names, stages, path)
    _check_report(raw.get("report") or {}, {k for r in runs for k in r.fields}, path)
    return Pipeline(path=path, name=str(raw["name"]), description=str(raw.get("description",
                    "")).strip(), variables=names, stages=stages,
                    runs=runs, analyses=_analyses(raw, names, path),
                    report=raw.get("report") or {},
                    executor=interpolate(raw.get("executor") or {}, names, "executor", path),
                    out=out, raw=raw)
