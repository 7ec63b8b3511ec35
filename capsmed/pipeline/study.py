"""A pipeline's own tables: our numbers beside the paper's, as the YAML lays them out.

``report.tables`` in a pipeline file lists tables of two kinds:

* ``metric`` (default): rows and columns are grid fields (e.g. ``condition`` x
  ``arch``); a cell is the mean +- sample std of ``metric`` over the runs in it (the
  repetitions: seeds, folds), followed by the paper's printed value when ``paper``
  gives one (``paper: {ROW: {COLUMN: value}}``);
* ``per_class``: the confusion matrices of the runs ``where`` selects are summed
  (paper 001 pools its folds) and each class's precision and sensitivity shown beside
  ``paper: {CLASS: {precision: v, sensitivity: v}}``.

A ``metric`` table can also read its numbers from a file each run folder holds (an
analysis' JSON): ``file: analysis/compactness/compactness.json`` and ``key:`` a dotted
path in it (a file under ``analysis/`` only where the pipeline's analyses, as the
file now stands, wrote it). ``scale: 100`` prints percentages, as papers often do. The
tables go to ``OUT/report/study.md`` and ``study.json``; ``capsmed report``'s own
tables (all runs grouped by dataset, architecture and protocol) go to
``OUT/report/aggregate/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.evaluate.aggregate import EvaluatedRun, describe
from capsmed.evaluate.caveats import cell_notes, mark, unfinished
from capsmed.evaluate.claims import ClaimResult
from capsmed.evaluate.per_class import pooled_per_class
from capsmed.evaluate.verdicts import WORDS, Verdict, summary, verdict
from capsmed.io import write_text_atomic
from capsmed.pipeline.checks import matches_selection, pooling_problem
from capsmed.pipeline.execute import analysed_run_dirs
from capsmed.pipeline.spec import Pipeline, RunSpec
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.study_claims import (
    claim_source,
    claims_html,
    claims_markdown,
    claims_table,
    judge_study_claims,
)
from capsmed.pipeline.study_curves import draw_table_curves
from capsmed.pipeline.study_routing import routing_tables
from capsmed.pipeline.study_runs import any_evaluated, current_dirs, evaluated, warn_unread
from capsmed.tables import Column, Table, render, text_column
from capsmed.tables.text import md_escape

log = logging.getLogger(__name__)


def _number(value: float | None, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _paper(spec: Mapping[str, Any], row: str, column: str | None = None) -> Any:
    """The paper's number of a cell; keys compared as text (YAML reads 0.5 as a number,
    the table's rows are the grid values' text)."""
    values = {str(k): v for k, v in (spec.get("paper") or {}).items()}.get(row)
    if column is None or not isinstance(values, Mapping):
        return values
    return {str(k): v for k, v in values.items()}.get(column)


def _json_value(path: Path, key: str) -> float | None:
    """The number at dotted ``key`` in a JSON file (None when absent or not a number)."""
    try:
        value: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for part in key.split("."):  # a number indexes a list: runs.0.test_entropy
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def table_values(spec: Mapping[str, Any], pipeline: Pipeline, state: PipelineState,
                 runs: Sequence[RunSpec], default_metric: str,
                 analysed: set[str] | None = None) -> list[tuple[RunSpec, float]]:
    """One number per finished run: ``metric`` of its ``evaluation`` report, or, with
    ``file`` (relative to the run folder, e.g. an analysis' JSON) and ``key`` (a dotted
    path in it), that number. A file under ``analysis/`` is read only from the run
    folders in ``analysed`` (:func:`analysed_run_dirs`): one left there by an analysis
    of an earlier version of the pipeline is not this pipeline's result."""
    if spec.get("file"):
        out, stale = [], 0
        for run, run_dir in current_dirs(pipeline, state, runs):
            path = run_dir / str(spec["file"])
            if str(spec["file"]).startswith("analysis/") and analysed is not None \
                    and str(run_dir) not in analysed:
                stale += path.is_file()
                continue
            value = _json_value(path, str(spec.get("key", default_metric)))
            if value is not None:
                out.append((run, value))
        if stale:
            log.warning("%s: %d run folder(s) hold %s from an analysis this pipeline does "
                        "not make (or not from these runs and data); not read", pipeline.path,
                        stale, spec["file"])
        return out
    metric = spec.get("metric", default_metric)
    return [(r, e.metrics[metric]) for r, e in
            evaluated(pipeline, state, runs, spec.get("evaluation", "report"))
            if metric in e.metrics]


def _metric_cell(values: Sequence[float], paper: Any, scale: float,
                 runs: Sequence[EvaluatedRun], judge: bool = True
                 ) -> tuple[str, dict[str, Any], Verdict | None]:
    """A cell's text (mean ± std (n) [paper X: verdict], † when a run is unfinished),
    its JSON and its verdict (None without a paper number, or when the table's paper
    numbers are a reference on other data: ``verdicts: false``)."""
    digits = 1 if scale == 100 else 3
    stat = describe(values)
    text = _number(stat.mean, scale, digits)
    if stat.std is not None:
        text += f" ± {_number(stat.std, scale, digits)}"
    text += f" (n={stat.n})" if stat.n > 1 else ""
    judged = (verdict(values, paper, scale) if judge and isinstance(paper, int | float)
              and not isinstance(paper, bool) else None)
    if paper is not None:
        text += f" [paper {paper}" + (f": {judged.word}]" if judged else "]")
    data = {**stat.to_dict(), "paper": paper, "unfinished": len(unfinished(runs)),
            **(judged.to_dict() if judged else {})}
    return mark(text, runs), data, judged


def metric_table(spec: Mapping[str, Any], found: Sequence[tuple[RunSpec, float]],
                 evaluated: Sequence[tuple[RunSpec, EvaluatedRun]] = ()
                 ) -> tuple[Table, dict[str, Any]]:
    """One ``metric`` table and its JSON form, a verdict on every paper number
    (:mod:`capsmed.evaluate.verdicts`); ``evaluated`` (the runs' reports, when the
    numbers come from them) marks cells with unfinished runs and adds the notes of
    :mod:`capsmed.evaluate.caveats`."""
    scale = float(spec.get("scale", 1))
    rows_by, cols_by = spec["rows"], spec["columns"]
    rows = list(dict.fromkeys(str(r.fields.get(rows_by)) for r, _ in found))
    cols = list(dict.fromkeys(str(r.fields.get(cols_by)) for r, _ in found))
    for key in (spec.get("paper") or {}):  # the paper's order where it gives one
        if str(key) in rows:
            rows.remove(str(key))
            rows.append(str(key))
    table = Table(str(spec.get("title", "")), [text_column(rows_by), *map(Column, cols)], [])
    cells: dict[str, Any] = {}
    reports: dict[str, list[EvaluatedRun]] = {}
    for r, e in evaluated:
        reports.setdefault(f"{r.fields.get(rows_by)} / {r.fields.get(cols_by)}", []).append(e)
    verdicts = []
    for row in rows:
        out = [row]
        for col in cols:
            values = [v for r, v in found if str(r.fields.get(rows_by)) == row
                      and str(r.fields.get(cols_by)) == col]
            paper = _paper(spec, row, col)
            if not values:
                out.append("-" if paper is None else f"- (paper {paper})")
                continue
            text, cells[f"{row}|{col}"], judged = _metric_cell(
                values, paper, scale, reports.get(f"{row} / {col}", []),
                judge=spec.get("verdicts", True))
            out.append(text)
            verdicts += [judged] if judged else []
        table.rows.append(out)
    table.notes += ([summary(verdicts)] if verdicts else []) + cell_notes(reports)
    pooled = pooling_problem(spec, "metric", [r for r, _ in found])  # a file's runs
    table.notes += [f"Not comparable: {pooled}."] if pooled else []
    counts = {w: sum(v.word == w for v in verdicts) for w in WORDS}
    return table, {"cells": cells, **({"verdicts": counts} if verdicts else {})}


def per_class_table(spec: Mapping[str, Any], found: Sequence[tuple[RunSpec, EvaluatedRun]]
                    ) -> tuple[Table, dict[str, Any]]:
    """Pooled per-class precision and sensitivity beside the paper's."""
    scale = float(spec.get("scale", 1))
    digits = 1 if scale == 100 else 3
    pooled = pooled_per_class([e for _, e in found])
    table = Table(str(spec.get("title", "")), [text_column("class"), Column("precision"),
                                                Column("sensitivity"), Column("support")], [])
    table.notes += cell_notes({"its runs": [e for _, e in found]})
    for name, values in pooled["per_class"].items():
        paper = _paper(spec, name) or {}
        cells = []
        for key in ("precision", "sensitivity"):
            text = _number(values[key], scale, digits)
            if isinstance(paper, Mapping) and paper.get(key) is not None:
                text += f" [paper {paper[key]}]"
            cells.append(text)
        table.rows.append([name, *cells, str(values["support"])])
    table.notes += _unshown_paper(spec, list(pooled["per_class"]))
    return table, {"per_class": pooled["per_class"], "runs": len(found)}


def _unshown_paper(spec: Mapping[str, Any], classes: Sequence[str]) -> list[str]:
    """A per-class table's paper numbers no row shows (a class the data does not have,
    a typo; a key other than precision and sensitivity), said instead of dropped."""
    paper = {str(k): v for k, v in (spec.get("paper") or {}).items()}
    unknown = [k for k in paper if k not in classes]
    keys = sorted({str(k) for v in paper.values() if isinstance(v, Mapping) for k in v}
                  - {"precision", "sensitivity"})
    keys += [f"{k} (a bare number)" for k, v in paper.items()
             if k in classes and v is not None and not isinstance(v, Mapping)]
    return ([f"Paper numbers of {', '.join(unknown)} not shown: not a class of these "
             f"runs ({', '.join(classes)})"] if unknown else []) + (
        [f"Paper numbers under {', '.join(keys)} not shown: a per-class table shows "
         "{precision: v, sensitivity: v} per class"] if keys else [])


def study_tables(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec],
                 out_dir: Path | None = None) -> tuple[list[Table], list[dict[str, Any]]]:
    """The tables of ``report.tables`` (one without runs says why) and their JSON; with
    ``out_dir``, a table marked ``curve`` is drawn there too (its JSON names the PNG)."""
    default_metric = pipeline.report.get("metric", "macro_f1")
    tables, data = [], []
    analysed = analysed_run_dirs(pipeline, state)
    for i, spec in enumerate(pipeline.report.get("tables") or []):
        spec = {"title": f"table {i + 1}", **spec}
        chosen = [r for r in runs if matches_selection(spec.get("where") or {}, r.fields)]
        kind = spec.get("kind", "metric")
        found: Sequence[Any] = (
            evaluated(pipeline, state, chosen, spec.get("evaluation", "report"))
            if kind == "per_class" else
            table_values(spec, pipeline, state, chosen, default_metric, analysed))
        if not found:
            tables.append(Table(spec["title"], [], [],
                                notes=[_why_empty(spec, pipeline, state, chosen)]))
            continue
        reports = (evaluated(pipeline, state, chosen, spec.get("evaluation", "report"))
                   if kind == "metric" and not spec.get("file") else [])
        table, numbers = (per_class_table(spec, found) if kind == "per_class"
                          else metric_table(spec, found, reports))
        if kind != "per_class":
            numbers["metric"] = (f"{spec['file']}:{spec.get('key', default_metric)}"
                                 if spec.get("file") else spec.get("metric", default_metric))
        table.notes[:0] = [spec["note"]] if spec.get("note") else []
        tables.append(table)
        data.append({"title": spec["title"], "kind": kind, "runs": len(found), **numbers})
        curve = out_dir / f"curve_{i + 1}.png" if out_dir is not None else None
        if curve is not None and kind == "metric" \
                and draw_table_curves(spec, found, curve, default_metric):
            data[-1]["curve"] = curve.name
    return tables, data


def write_study_report(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec]
                       ) -> Path | None:
    """Write ``OUT/report/study.md``, ``study.html`` and ``study.json`` (the tables, their
    curves, the claims' verdicts, the routing of the capsule runs) and ``capsmed
    report``'s tables; returns the Markdown path, or None when no run is evaluated yet."""
    out_dir = state.out / "report"
    for old in out_dir.glob("curve_*.png"):  # a table no longer drawn leaves none behind
        old.unlink()
    warn_unread(pipeline, state, runs)
    tables, data = study_tables(pipeline, state, runs, out_dir)
    if not data and not any_evaluated(pipeline, state, runs):
        # nothing of this pipeline to show: an older study.md must not pass for its report
        for stale in ("study.md", "study.json", "study.html"):
            (out_dir / stale).unlink(missing_ok=True)
        shutil.rmtree(out_dir / "aggregate", ignore_errors=True)
        log.warning("%s: no study report written: no run of it is evaluated yet",
                    pipeline.path)
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    done = evaluated(pipeline, state, runs, "report")
    if done:
        _aggregate(state, [e for _, e in done], out_dir / "aggregate",
                   pipeline.report.get("metric", "macro_f1"))
    else:  # capsmed report reads each run's report/ folder
        shutil.rmtree(out_dir / "aggregate", ignore_errors=True)
        log.warning("%s: no aggregate/ tables: capsmed report reads each run's evaluation "
                    "named 'report', and no run has one yet", pipeline.path)
    parts = _study_parts(pipeline, state, runs, tables, data)
    ending = ("Cells: mean ± sample std over the repetitions (n), [the paper's number: "
              "verdict]. "
              + ("All runs grouped by dataset, architecture and protocol: aggregate/."
                 if done else ""))
    path = out_dir / "study.md"
    write_text_atomic(path, study_markdown(pipeline, parts, ending))
    write_text_atomic(out_dir / "study.html",
                      study_page(pipeline, parts, [e for _, e in done], out_dir, ending))
    write_text_atomic(out_dir / "study.json", json.dumps(
        {"tables": data, "claims": [r.to_dict() for r in parts.claims],
         "routing": parts.routing_data}, indent=1, default=str))
    return path


@dataclass
class StudyParts:
    """What a study page shows, in its order."""

    tables: list[Table]
    data: list[dict[str, Any]]  # the tables' JSON; ``curve`` names a table's PNG
    claims: list[ClaimResult]
    routing: list[Table]
    routing_data: list[dict[str, Any]]

    def curves(self) -> list[tuple[str, str]]:
        """``(table title, PNG file name)`` of each table drawn as curves."""
        return [(d["title"], d["curve"]) for d in self.data if d.get("curve")]


def _study_parts(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec],
                 tables: list[Table], data: list[dict[str, Any]]) -> StudyParts:
    analysed = analysed_run_dirs(pipeline, state)
    claims = judge_study_claims(pipeline.claims, runs, lambda claim, chosen: table_values(
        claim_source(claim), pipeline, state, chosen, claim.metric, analysed))
    routing, routing_data = routing_tables(
        [(r.label, d) for r, d in current_dirs(pipeline, state, runs)], analysed)
    return StudyParts(tables, data, claims, routing, routing_data)


def study_markdown(pipeline: Pipeline, parts: StudyParts, ending: str) -> str:
    """``study.md``: the tables (a curve's PNG linked under its table), the claims with
    their quotes, the routing tables."""
    text = f"# {md_escape(pipeline.name)}\n\n{pipeline.description.strip()}\n\n"
    curves = dict(parts.curves())
    for table in parts.tables:
        text += render("md", [table]) + "\n"
        if table.title in curves:
            alt = md_escape(table.title).replace("[", r"\[").replace("]", r"\]")
            text += f"![{alt}: ours beside the paper's]({curves[table.title]})\n\n"
    if parts.claims:
        text += render("md", [claims_table(parts.claims)]) + "\n" \
            + claims_markdown(parts.claims) + "\n"
    if parts.routing:
        text += render("md", parts.routing) + "\n"
    return text + f"{ending.strip()}\n"


def study_page(pipeline: Pipeline, parts: StudyParts, done: Sequence[EvaluatedRun],
               out_dir: Path, ending: str) -> str:
    """``study.html``: self-contained like report.html, with what made it (pipeline file,
    capsmed version), every table with its verdicts and notes and its curves, the
    claims, the routing of the capsule runs, capsmed report's fraction plots, and a link
    to each evaluated run's report.html."""
    from capsmed import __version__
    from capsmed.evaluate.html import about_table, esc, figure_html, figure_sections, page
    from capsmed.tables.html import html_table

    facts = {"pipeline file": pipeline.path, "capsmed version": __version__,
             "written (UTC)": datetime.now(UTC).isoformat(timespec="seconds"),
             "evaluated runs": len(done)}
    curves = dict(parts.curves())
    body = []
    for table in parts.tables:
        body.append(html_table(table))
        if table.title in curves and (out_dir / curves[table.title]).is_file():
            body.append(figure_html("ours (lines, ± 1 std) beside the paper's points "
                                    "(hollow markers)", out_dir / curves[table.title]))
    if parts.claims:
        body += [html_table(claims_table(parts.claims)), claims_html(parts.claims)]
    body += [html_table(t) for t in parts.routing]
    plots = [("capsmed report: the metric against the training fraction", p.name, p)
             for p in sorted((out_dir / "aggregate").glob("fraction_*.png"))]
    links = [f'<li><a href="{esc(os.path.relpath(e.path / "report" / "report.html", out_dir))}'
             f'">{esc(e.path.name)}</a></li>' for e in sorted(done, key=lambda e: e.path)]
    return page(pipeline.name, [
        f'<p class="lead">{esc(pipeline.description.strip())}</p>', about_table(facts),
        *body, *figure_sections(plots),
        f"<p>{esc(ending.strip())}</p>", "<h2>Runs (their report.html)</h2>",
        f'<ul class="runs">{"".join(links)}</ul>'], "capsmed run")


def _why_empty(spec: Mapping[str, Any], pipeline: Pipeline, state: PipelineState,
               runs: Sequence[RunSpec]) -> str:
    """The line an empty table shows: no finished run, or finished runs without it."""
    if spec.get("file") or spec.get("kind", "metric") == "per_class":
        return "no finished run yet"
    found = evaluated(pipeline, state, runs, spec.get("evaluation", "report"))
    metric = spec.get("metric", pipeline.report.get("metric", "macro_f1"))
    return (f"none of the {len(found)} finished runs has {metric} in its report"
            if found else "no finished run yet")


def _aggregate(state: PipelineState, runs: Sequence[EvaluatedRun], out: Path,
               metric: str) -> None:
    """``capsmed report`` over ``runs``, as the study index holds them."""
    from capsmed.evaluate.aggregate import Collection
    from capsmed.evaluate.aggregate_report import ReportConfig, report_runs

    try:
        stale = [why for r in runs if (why := state.index().stale(r.path))]
        if stale:  # what capsmed report refuses (it reads the same files)
            raise CapsmedError(stale[0])
        report_runs([r.path for r in runs], out, ReportConfig(metric=metric),
                    Collection(runs=list(runs), skipped=[]))
    except CapsmedError as exc:  # e.g. a metric some datasets lack: the study stands
        log.warning("capsmed report over the runs skipped: %s", exc)
