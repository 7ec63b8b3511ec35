"""``capsmed run PIPELINE.yaml``: data stages, the training grid, analyses, the report.

Order of work: check that every raw input exists (before anything runs), make the data
stages the selected runs need (once each), give every run its identity, skip the
finished ones, run the rest on the chosen executor with retries, run the analyses,
then write the study's tables (ours beside the paper's numbers) and ``capsmed report``.
A failed run never stops the others; they are listed at the end with their logs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline.checks import parse_selection
from capsmed.pipeline.display import RunBoard
from capsmed.pipeline.execute import (
    analysis_argv,
    analysis_done,
    analysis_inputs,
    analysis_runs,
    current_identity,
    execute_analysis,
    execute_stage,
    remade_outputs,
    stage_done,
)
from capsmed.pipeline.spec import Pipeline, RunSpec, Stage
from capsmed.pipeline.state import PipelineState

log = logging.getLogger(__name__)

EXECUTORS = ("local", "slurm")


@dataclass
class RunOptions:
    """How to run a pipeline (``capsmed run`` flags; the YAML's ``executor`` section
    gives the defaults)."""

    only: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    retries: int = 1
    executor: str | None = None
    jobs: int | None = None
    gpus: list[str] | None = None
    slurm: dict[str, Any] = field(default_factory=dict)
    report: bool = True


def select_runs(pipeline: Pipeline, only: Sequence[str], exclude: Sequence[str]
                ) -> list[RunSpec]:
    """The grid after ``--only`` / ``--exclude`` (FIELD=VALUE[,FIELD=VALUE]).

    ``--only``: every named field must have one of the values given for it (repeat a
    field to allow several values). ``--exclude``: each occurrence drops the runs that
    match all of its pairs (``condition=noaug,dataset=mnist``).
    """
    keep = parse_selection(list(only), "--only")
    drops = [parse_selection([item], "--exclude") for item in exclude]
    fields = {k for r in pipeline.runs for k in r.fields}
    unknown = sorted((set(keep) | {k for d in drops for k in d}) - fields)
    if unknown:
        raise CapsmedError(f"{pipeline.path}: --only/--exclude: unknown field(s) "
                           f"{', '.join(unknown)} (the grid has: {', '.join(sorted(fields))})")
    return [r for r in pipeline.runs
            if r.matches(keep) and not any(r.matches(d) for d in drops)]


def needed_stages(pipeline: Pipeline, runs: Sequence[RunSpec]) -> list[Stage]:
    """The data stages whose outputs the runs (or the analyses) read."""
    paths = {str(r.train.get("data")) for r in runs}
    paths |= {str(e.data) for r in runs for e in r.evaluations if e.data}
    words = {w for a in pipeline.analyses for w in a.command}
    return [s for s in pipeline.stages.values()
            if str(s.output) in paths or (runs and any(str(s.output) in w for w in words))]


def check_inputs(pipeline: Pipeline, stages: Sequence[Stage], state: PipelineState) -> None:
    """Fail at once, naming every missing raw input and the command that makes it."""
    missing = []
    for stage in stages:
        if stage_done(state, stage):
            continue
        for req in stage.requires:
            if not req.path.exists():
                hint = f"; make it with: {req.make}" if req.make else ""
                missing.append(f"{req.path}: not found (data stage '{stage.name}'){hint}")
    if missing:
        raise CapsmedError(f"{pipeline.path}: missing input(s) -- "
                           + " | ".join(missing) + " (or point the pipeline elsewhere: "
                           "--set data_root=DIR)")


def plan(pipeline: Pipeline, runs: Sequence[RunSpec], state: PipelineState
         ) -> list[tuple[RunSpec, str | None, str]]:
    """Each run with its identity (None until its data exists) and its status:
    ``outdated`` when a data stage it reads will be made again (changed commands), so
    its finished folder, if any, no longer counts."""
    remade = remade_outputs(pipeline, state)
    out: list[tuple[RunSpec, str | None, str]] = []
    owner: dict[str, str] = {}
    for run in runs:
        run_id = current_identity(run, remade)
        if run_id is None:
            inputs = {str(run.train.get("data"))} | {str(e.data) for e in run.evaluations}
            out.append((run, None, "outdated" if inputs & remade else "pending"))
            continue
        other = owner.setdefault(run_id, run.label)
        if other != run.label:  # the same options on two data files of equal content
            raise CapsmedError(f"{pipeline.path}: runs {other} and {run.label} have one "
                               f"identity ({run_id}): same options, data of the same "
                               "content; drop one of them")
        out.append((run, run_id, state.status(run, run_id)))
    return out


def _executor_settings(pipeline: Pipeline, options: RunOptions) -> tuple[str, int, list[str]]:
    cfg = pipeline.executor
    kind = options.executor or cfg.get("kind", "local")
    if kind not in EXECUTORS:
        raise CapsmedError(f"--executor must be one of {', '.join(EXECUTORS)}, got '{kind}'")
    gpus = options.gpus if options.gpus is not None else [str(g) for g in cfg.get("gpus", [])]
    if options.gpus is None and not cfg.get("gpus"):
        gpus = _visible_gpus()
    jobs = options.jobs or int(cfg.get("jobs", 0)) or max(1, len(gpus))
    return kind, jobs, gpus[:jobs] if gpus else []


def _visible_gpus() -> list[str]:
    """CUDA devices of this machine (none on a CPU-only one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def run_pipeline(pipeline: Pipeline, options: RunOptions) -> int:
    """Run what is not finished; returns the exit code (1 if anything failed)."""
    state = PipelineState(pipeline.out)
    runs = select_runs(pipeline, options.only, options.exclude)
    if not runs:
        raise CapsmedError(f"{pipeline.path}: no run matches the selection")
    stages = needed_stages(pipeline, runs)
    check_inputs(pipeline, stages, state)
    kind, jobs, gpus = _executor_settings(pipeline, options)
    if kind == "slurm":
        from capsmed.pipeline.slurm import require_slurm

        require_slurm(options.slurm)
    state.acquire_lock()
    started = time.monotonic()
    board = RunBoard(pipeline.name, len(runs))
    failures: dict[str, str] = {}
    try:
        with board:
            bad_stages = _make_data(state, stages, board)
            todo = []
            for run, run_id, status in plan(pipeline, runs, state):
                if run.stage in bad_stages or run_id is None:
                    why = bad_stages.get(run.stage or "", "its data file was not made")
                    failures[run.label] = f"data stage '{run.stage}': {why}"
                    board.event("failed", run, run_id or "-", failures[run.label])
                elif status == "done":
                    board.event("done", run, run_id, "finished earlier")
                else:
                    todo.append((run, run_id))
            failures.update(_execute(state, todo, kind, jobs, gpus, options, board,
                                     pipeline.name))
            if not failures:
                failures.update(_analyses(pipeline, state, runs, board))
        if options.report:  # over every finished run of the grid, not just the selection
            from capsmed.pipeline.study import write_study_report

            written = write_study_report(pipeline, state, pipeline.runs)
            board.note(f"report: {written}" if written else "no study report: no run of "
                       "this pipeline is evaluated yet (any earlier study.md was removed)")
    finally:
        state.release_lock()
    board.summary(failures, time.monotonic() - started, state)
    return 1 if failures else 0


def _make_data(state: PipelineState, stages: Sequence[Stage], board: RunBoard
               ) -> dict[str, str]:
    bad = {}
    for stage in stages:
        if stage_done(state, stage):
            continue
        board.note(f"data stage '{stage.name}' -> {stage.output}")
        reason = execute_stage(state, stage, {})
        if reason:
            bad[stage.name] = reason
            board.note(f"data stage '{stage.name}' FAILED: {reason}")
    return bad


def _execute(state: PipelineState, todo: list[tuple[RunSpec, str]], kind: str, jobs: int,
             gpus: list[str], options: RunOptions, board: RunBoard, name: str
             ) -> dict[str, str]:
    if not todo:
        return {}
    if kind == "slurm":
        from capsmed.pipeline.slurm import run_slurm

        failures = run_slurm(state, todo, options.slurm, options.retries, board.event, name)
    else:
        from capsmed.pipeline.local import run_local

        failures = run_local(state, todo, jobs, gpus, options.retries, board.event)
    labels = {run_id: run.label for run, run_id in todo}
    return {labels[k]: v for k, v in failures.items()}


def _analyses(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec],
              board: RunBoard) -> dict[str, str]:
    """Run the analyses not done with this command and these data files. One that
    reads a run outside --only/--exclude waits for a run of the whole grid (on a part
    of its runs it would write a different result under the same name)."""
    failures = {}
    selected = {r.label for r in runs}
    for analysis in pipeline.analyses:
        outside = [r.label for r in analysis_runs(analysis, pipeline.runs)
                   if r.label not in selected]
        if outside:
            board.note(f"analysis '{analysis.name}' not run: it reads {len(outside)} "
                       f"run(s) outside the selection ({outside[0]}, ...)")
            continue
        argv = analysis_argv(analysis, pipeline, state)
        inputs = analysis_inputs(pipeline, argv)
        if analysis_done(state, analysis, argv, inputs):
            continue
        board.note(f"analysis '{analysis.name}'"
                   + (f" -> {analysis.output}" if analysis.output else ""))
        reason = execute_analysis(state, analysis, argv, inputs, {})
        if reason:
            failures[f"analysis {analysis.name}"] = reason
    return failures


def status_rows(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec]
                ) -> list[dict[str, Any]]:
    """One row per run for ``--dry-run`` and ``capsmed run status``."""
    rows = []
    for run, run_id, status in plan(pipeline, runs, state):
        record = state.read_record(run_id) if run_id else {}
        rows.append({"label": run.label, "fields": run.fields, "id": run_id,
                     "status": status, "attempts": record.get("attempts", 0),
                     "log": str(state.log_path(run, run_id)) if run_id else None,
                     "epochs": run.train.get("epochs")})
    return rows


def foreign_run_dirs(pipeline: Pipeline, state: PipelineState) -> list[Path]:
    """Folders under ``out/runs`` that belong to no run of the pipeline as it is now:
    their options, data or capsmed's protocol revision changed since. Folders of a run
    whose identity cannot be known yet (its data not made) are never counted."""
    current, unknown = set(), set()
    for run, run_id, _ in plan(pipeline, pipeline.runs, state):
        if run_id is None:
            unknown.add(run.label)
        else:
            current.add(state.run_dir(run, run_id))
    folder = state.out / "runs"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p not in current
                  and p.name.rpartition("-")[0] not in unknown)


def count_by_status(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def ensure_path(path: Path) -> Path:
    if not Path(path).is_file():
        raise CapsmedError(f"{path}: no such pipeline file (see pipelines/ for the studies)")
    return Path(path)
