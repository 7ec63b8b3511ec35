"""A study table drawn as curves beside the paper's points (``curve:`` in its spec).

``curve: {x: fraction}`` (or ``curve: true``) places each row at the value of the
training option ``x`` its runs share: the training fraction, drawn in percent, runs
without one at 100 %. ``curve: {x: {f1: 1, f5: 5, full: 100}}`` gives each row's
position instead. ``xlabel`` names the axis, ``log_x: false`` makes it linear. The
PNG (``curve_<table number>.png``) lies beside study.md; the paper's numbers of the
table are drawn as hollow markers (:func:`capsmed.evaluate.curve_plot.plot_curves`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError

CURVE_KEYS = {"x", "xlabel", "log_x"}


def curve_spec(raw: Any) -> dict[str, Any] | None:
    """The table's ``curve`` as a mapping (``true``: by training fraction), or None."""
    if raw is None or raw is False:
        return None
    return {"x": "fraction"} if raw is True else dict(raw)


def check_curve(raw: Any, rows: list[str], train_fields: set[str], where: str,
                path: Path) -> None:
    """Refuse a curve spec that would draw nothing (a misspelt option or row)."""
    if raw is None or isinstance(raw, bool):
        return
    spec = raw
    if not isinstance(spec, Mapping) or set(spec) - CURVE_KEYS or "x" not in spec:
        raise CapsmedError(f"{path}: {where}.curve: expected true or a mapping with x "
                           "(a training option, or {ROW: number}) and optional xlabel, "
                           "log_x")
    x = spec["x"]
    if isinstance(x, Mapping):
        bad = [str(k) for k, v in x.items() if str(k) not in rows
               or not isinstance(v, int | float) or isinstance(v, bool)]
        if bad:
            raise CapsmedError(f"{path}: {where}.curve.x: {bad[0]} is not a row of the "
                               f"table with a number (its rows: {', '.join(rows)})")
        at_zero = [str(k) for k, v in x.items() if v <= 0]
        if at_zero and spec.get("log_x", True):  # a log axis has no place for them
            raise CapsmedError(f"{path}: {where}.curve.x: row {at_zero[0]} is at "
                               f"{x[at_zero[0]]}, which a log axis cannot show; give "
                               "log_x: false, or a number above 0")
    elif str(x) not in train_fields:
        raise CapsmedError(f"{path}: {where}.curve.x: '{x}' is not a capsmed train "
                           "option (e.g. fraction), nor a mapping {ROW: number}")


def _positions(spec: Mapping[str, Any], rows_by: str,
               found: Sequence[tuple[Any, float]]) -> dict[str, float]:
    """Each row's x: given, or the option value every run of the row shares."""
    x = spec["x"]
    if isinstance(x, Mapping):
        return {str(k): float(v) for k, v in x.items()}
    values: dict[str, set[float]] = {}
    for run, _ in found:
        value = run.train.get(x, 1.0 if x == "fraction" else None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.setdefault(str(run.fields.get(rows_by)), set()).add(
                float(value) * (100 if x == "fraction" else 1))
    return {row: next(iter(v)) for row, v in values.items() if len(v) == 1}


def draw_table_curves(table_spec: Mapping[str, Any], found: Sequence[tuple[Any, float]],
                      path: Path, default_metric: str = "macro_f1"
                      ) -> dict[str, int] | None:
    """Draw a ``metric`` table's numbers (``(run, value)``) as curves into ``path``;
    None when the table asks for none or no row has a position."""
    spec = curve_spec(table_spec.get("curve"))
    if spec is None:
        return None
    from capsmed.evaluate.curve_plot import plot_curves

    rows_by, cols_by = table_spec["rows"], table_spec["columns"]
    x = _positions(spec, rows_by, found)
    if not x:
        return None
    ours: dict[str, dict[str, list[float]]] = {}
    for run, value in found:
        column = ours.setdefault(str(run.fields.get(cols_by)), {})
        column.setdefault(str(run.fields.get(rows_by)), []).append(value)
    paper = {str(row): {str(c): v for c, v in values.items()}
             for row, values in (table_spec.get("paper") or {}).items()
             if isinstance(values, Mapping)}
    xlabel = spec.get("xlabel") or ("training data (%)" if spec["x"] == "fraction"
                                    else str(spec["x"]) if isinstance(spec["x"], str)
                                    else rows_by)
    metric = table_spec.get("metric") or table_spec.get("key") or default_metric
    scale = float(table_spec.get("scale", 1))
    # scale: 100 draws percentages: the axis says so, as the x axis does for fractions
    ylabel = str(metric).replace("_", " ") + (" (%)" if scale == 100 else "")
    return plot_curves(path, _short(str(table_spec.get("title", ""))), x, ours, paper,
                       xlabel=xlabel, ylabel=ylabel, log_x=bool(spec.get("log_x", True)),
                       scale=scale)


def _short(title: str, width: int = 70) -> str:
    """A figure title that fits above the plot: cut at a word, never mid-word."""
    if len(title) <= width:
        return title
    return title[:width].rsplit(" ", 1)[0] + " ..."
