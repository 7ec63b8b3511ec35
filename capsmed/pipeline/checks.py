"""Checks of a pipeline file that need its whole expanded grid, made when it is read.

A field or value that a rule, an exclusion, a table or an analysis filter names but
the grid does not have would match nothing, and an axis that sets nothing would train
one run several times under several labels: either way the study exits 0 but is not
the one its YAML describes. So each is a one-line error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline.identity import RunLike, identity_payload
from capsmed.train.config import TrainConfig

REPORT_KEYS = {"metric", "tables"}
TABLE_KEYS = {"title", "kind", "where", "rows", "columns", "metric", "evaluation", "paper",
              "scale", "note", "file", "key", "curve", "verdicts"}


def _fail(path: Path, message: str) -> CapsmedError:
    return CapsmedError(f"{path}: {message}")


def known_metrics() -> list[str]:
    """The run-level numbers ``capsmed evaluate``'s report.json gives a table
    (:func:`capsmed.evaluate.aggregate.overall_metrics`; the Agr report adds two)."""
    from capsmed.evaluate.aggregate import METRIC_ORDER

    return [*METRIC_ORDER, "agreement_mean_accuracy"]


def values_of(wanted: Any) -> list[Any]:
    """A selection's value, or its list (any of them) of values."""
    return list(wanted) if isinstance(wanted, list | tuple | set | frozenset) else [wanted]


def matches_selection(selection: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    """Whether every named field has one of its selected values (compared as text)."""
    return all(str(fields.get(k)) in {str(v) for v in values_of(wanted)}
               for k, wanted in selection.items())


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


def run_filter(arg: str) -> dict[str, set[str]] | None:
    """The selection of an analysis argument ``{runs:FIELD=VALUE,...}``, else None."""
    if not (arg.startswith("{runs:") and arg.endswith("}")):
        return None
    return parse_selection([arg[6:-1]], "{runs:...}") if arg[6:-1] else {}


def grid_axes(combos: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each grid field and its values (as text), over every block; ``None`` (YAML
    ``null``) is a value of a field some block lacks: it selects that block's runs."""
    combos = list(combos)
    axes: dict[str, list[str]] = {}
    for combo in combos:
        for key, value in combo.items():
            values = axes.setdefault(key, [])
            if str(value) not in values:
                values.append(str(value))
    for key, values in axes.items():
        if any(key not in combo for combo in combos):
            values.append(str(None))
    return axes


def check_selection(selection: Any, axes: Mapping[str, list[str]], where: str,
                    path: Path) -> None:
    """Refuse a field the grid lacks, or a value that is not on that field's axis."""
    if not isinstance(selection, Mapping):
        raise _fail(path, f"{where}: expected a mapping of grid field: value(s), got "
                    f"'{selection}'")
    for key, wanted in selection.items():
        if key not in axes:
            raise _fail(path, f"{where}: unknown grid field '{key}' (the grid has: "
                        f"{', '.join(axes)})")
        bad = [str(v) for v in values_of(wanted) if str(v) not in axes[key]]
        if bad:
            raise _fail(path, f"{where}: {key} has no value {', '.join(bad)} on the grid "
                        f"(its values: {', '.join(axes[key])})")


def check_distinct_runs(runs: Iterable[RunLike], path: Path, train_fields: Iterable[str]
                        ) -> None:
    """Refuse two grid points that would train the very same run (an axis that sets
    no option, such as a misspelt ``seeds``): they would share one run identity."""
    seen: dict[str, RunLike] = {}
    train_fields = sorted(train_fields)
    for run in runs:
        key = json.dumps(identity_payload(_as_trained(run), lambda p: f"file {p}"),
                         sort_keys=True, default=str)
        other = seen.setdefault(key, run)
        if other is run:
            continue
        differ = [k for k in dict.fromkeys([*other.fields, *run.fields])
                  if str(other.fields.get(k)) != str(run.fields.get(k))]
        if all(k in train_fields for k in differ):  # seed: [0] beside a block without
            pairs = ", ".join(f"{k} {_given(other, k)} and {_given(run, k)}" for k in differ)
            raise _fail(path, f"grid points {other.label} and {run.label} are the same "
                        f"run: {pairs} train alike (an option left out trains at train:'s "
                        "value or its default, and 1 is 1.0); keep one of them")
        hints = [f"'{k}' is not a capsmed train option; did you mean '{m[0]}'?"
                 for k in differ if (m := difflib.get_close_matches(k, train_fields, 1))]
        raise _fail(path, f"grid points {other.label} and {run.label} are the same run "
                    f"(same training options and data): {', '.join(differ)} sets "
                    "nothing; name a capsmed train option, or use it in a rule or a "
                    "{placeholder}" + (f" ({' '.join(hints)})" if hints else ""))


def _given(run: RunLike, key: str) -> str:
    return str(run.fields[key]) if key in run.fields else "left out"


_FLOAT_OPTIONS = {f.name for f in dataclasses.fields(TrainConfig)
                  if f.type in ("float", "float | None")}


def _as_trained(run: RunLike) -> SimpleNamespace:
    """The run with every training option as it trains: an option left out at its
    default (a grid block without a ``seed`` axis trains seed 0, as ``seed: [0]`` of
    another block does), and a whole number of a float option as that float (1 is 1.0)."""
    config = TrainConfig.from_dict({**run.train, "out": None}, run.label).to_dict()
    return SimpleNamespace(train={
        k: float(v) if k in _FLOAT_OPTIONS and isinstance(v, int) and not isinstance(v, bool)
        else v for k, v in config.items()})


def _check_metric(metric: Any, where: str, path: Path) -> None:
    if metric not in known_metrics():
        raise _fail(path, f"{where}: unknown metric '{metric}' (report.json gives: "
                    f"{', '.join(known_metrics())})")


def check_report(report: Any, runs: list[RunLike], axes: Mapping[str, list[str]],
                 path: Path) -> None:
    """Table specs are checked when the file is read, not hours later at the end."""
    if not isinstance(report, dict):
        raise _fail(path, "'report' must be a mapping")
    bad = sorted(set(report) - REPORT_KEYS)
    if bad:
        raise _fail(path, f"report: unknown key(s) {', '.join(bad)} (allowed: "
                    f"{', '.join(sorted(REPORT_KEYS))})")
    default_metric = report.get("metric", "macro_f1")
    _check_metric(default_metric, "report.metric", path)
    for i, spec in enumerate(report.get("tables") or []):
        _check_table(spec, f"report.tables[{i}]", runs, axes, path)


def _check_table(spec: Any, where: str, runs: list[RunLike],
                 axes: Mapping[str, list[str]], path: Path) -> None:
    if not isinstance(spec, dict):
        raise _fail(path, f"{where}: expected a mapping")
    bad = sorted(set(spec) - TABLE_KEYS)
    if bad:
        raise _fail(path, f"{where}: unknown key(s) {', '.join(bad)} (allowed: "
                    f"{', '.join(sorted(TABLE_KEYS))})")
    kind = spec.get("kind", "metric")
    if kind not in ("metric", "per_class"):
        raise _fail(path, f"{where}: kind must be metric or per_class, got '{kind}'")
    for key in ("rows", "columns") if kind == "metric" else ():
        if spec.get(key) not in axes:
            raise _fail(path, f"{where}: {key} must be a grid field ({', '.join(axes)}), "
                        f"got '{spec.get(key)}'")
    check_selection(spec.get("where") or {}, axes, f"{where}.where", path)
    chosen = [r for r in runs if matches_selection(spec.get("where") or {}, r.fields)]
    if not chosen:
        raise _fail(path, f"{where}: 'where' matches no run of the grid")
    if not isinstance(spec.get("verdicts", True), bool):
        raise _fail(path, f"{where}.verdicts: expected true or false, got "
                    f"{spec['verdicts']!r}")
    if spec.get("curve") not in (None, False):
        _check_curve_of(spec, kind, chosen, where, path)
    if kind == "metric" and spec.get("paper") is not None:
        _check_paper(spec, chosen, where, path)
    if not spec.get("file"):  # a file's numbers: only the runs that have it (study.py)
        problem = pooling_problem(spec, kind, chosen)
        if problem:
            raise _fail(path, f"{where}: {problem}")
    if kind == "metric" and spec.get("file"):
        return
    if "metric" in spec:
        _check_metric(spec["metric"], f"{where}.metric", path)
    evaluation = spec.get("evaluation", "report")
    names = list(dict.fromkeys(e.name for r in chosen for e in r.evaluations))
    if evaluation not in names:
        raise _fail(path, f"{where}: evaluation '{evaluation}' is not an evaluation of "
                    f"its runs ({', '.join(names)})")


REPETITION_FIELDS = ("seed", "fold")  # what a cell's mean and std are taken over


def pooling_problem(spec: Mapping[str, Any], kind: str, runs: Sequence[RunLike]) -> str:
    """What is wrong when a cell (a per-class table: the table) pools runs that differ in
    a grid field other than the repetition (a fraction, an augmentation): they would be
    averaged as if they were seeds. Empty when every cell pools repetitions only."""
    keys = (spec["rows"], spec["columns"]) if kind == "metric" else ()
    cells: dict[tuple[str, ...], list[RunLike]] = {}
    for run in runs:
        cells.setdefault(tuple(str(run.fields.get(k)) for k in keys), []).append(run)
    for cell, members in cells.items():
        for name in dict.fromkeys(k for r in members for k in r.fields):
            if name in keys or name in REPETITION_FIELDS:
                continue
            values = list(dict.fromkeys(str(r.fields.get(name)) for r in members))
            if len(values) > 1:
                place = f"cell {' / '.join(cell)}" if cell else "the table"
                return (f"{place} pools runs of {name} {', '.join(values)} as if they were "
                        f"repetitions; choose one in 'where' (where: {{{name}: ...}}) or "
                        f"make {name} the rows or columns")
    return ""


def _check_paper(spec: dict[str, Any], chosen: list[RunLike], where: str, path: Path
                 ) -> None:
    """A metric table's ``paper`` numbers sit under the table's rows and columns (a key
    that is not one, a YAML 0.5 for the row "0.5" or a typo, was never shown or judged),
    and in the table's units: a percentage beside a fraction is judged "below"."""
    paper = spec["paper"]
    if not isinstance(paper, dict):
        raise _fail(path, f"{where}.paper: expected a mapping of row: {{column: number}}")
    axes = {k: sorted({str(r.fields.get(spec[k])) for r in chosen}) for k in ("rows", "columns")}
    numbers = []
    for row, value in paper.items():
        _check_paper_key(row, axes["rows"], f"{where}.paper", "row", path)
        for column, number in (value.items() if isinstance(value, dict) else [(None, value)]):
            if column is not None:
                _check_paper_key(column, axes["columns"], f"{where}.paper.{row}", "column",
                                 path)
            if number is not None and (isinstance(number, bool)
                                       or not isinstance(number, int | float)
                                       or not math.isfinite(number)):  # .nan, .inf
                raise _fail(path, f"{where}.paper.{row}: expected numbers, got {number!r}")
            numbers += [] if number is None else [float(number)]
    scale = spec.get("scale", 1)
    if spec.get("file") or not numbers:  # a number read from a file may have any range
        return
    if scale == 1 and max(numbers) > 1:
        raise _fail(path, f"{where}.paper: {max(numbers):g} is above 1, but the table's "
                    f"metric is a fraction (0-1): give scale: 100 for percentages")
    if scale == 100 and max(numbers) <= 1:
        raise _fail(path, f"{where}.paper: every number is at most 1, but scale: 100 shows "
                    "percentages: give the paper's numbers in percent, or drop the scale")


def _check_paper_key(key: Any, allowed: list[str], where: str, what: str, path: Path
                     ) -> None:
    if str(key) not in allowed:
        raise _fail(path, f"{where}: '{key}' is not a {what} of the table (its {what}s: "
                    f"{', '.join(allowed)}); the number would never be shown or judged")


def _check_curve_of(spec: dict[str, Any], kind: str, chosen: list[RunLike], where: str,
                    path: Path) -> None:
    from capsmed.pipeline.study_curves import check_curve

    if kind != "metric":
        raise _fail(path, f"{where}.curve: only a metric table is drawn as curves")
    rows = list(dict.fromkeys(str(r.fields.get(spec["rows"])) for r in chosen))
    check_curve(spec["curve"], rows, {f.name for f in dataclasses.fields(TrainConfig)},
                where, path)
