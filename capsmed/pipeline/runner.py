"""``capsmed run PIPELINE.yaml``: data stages, the training grid, analyses, the report.

Order of work: check that every raw input exists (before anything runs), give every
run whose data exists its identity and skip the finished ones, then hand the rest to
the executor as one batch of work items: the data stages to make, the runs to train
or evaluate (each after its data stage) and the analyses (each after its runs). The
runner knows executors only through :class:`~capsmed.pipeline.executors.Executor`;
:class:`~capsmed.pipeline.drive.Driver` follows the jobs with retries. At the end it
writes the study's tables (ours beside the paper's numbers) and ``capsmed report``. A
failed run never stops the others; they are listed at the end with their logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline import resources as res
from capsmed.pipeline.checks import parse_selection
from capsmed.pipeline.display import RunBoard
from capsmed.pipeline.drive import Driver
from capsmed.pipeline.execute import (
    analysis_runs,
    current_identity,
    remade_outputs,
    stage_done,
)
from capsmed.pipeline.executors import ExecutorSettings, create_executor
from capsmed.pipeline.spec import Pipeline, RunSpec, Stage
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.tasks import RunTask, StageTask, analysis_task
from capsmed.pipeline.work import JobState, WorkItem

log = logging.getLogger(__name__)


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
    resources: dict[str, Any] = field(default_factory=dict)  # --slurm-* overrides
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


def executor_for(pipeline: Pipeline, options: RunOptions) -> Any:
    """The executor ``--executor`` (else the YAML's ``executor.kind``) names, built
    with the same settings whatever it is."""
    cfg = pipeline.executor
    kind = options.executor or cfg.get("kind", "local")
    gpus = options.gpus if options.gpus is not None else (
        [str(g) for g in cfg["gpus"]] if cfg.get("gpus") else None)
    jobs = options.jobs or (int(cfg["jobs"]) if cfg.get("jobs") else None)
    return create_executor(kind, ExecutorSettings(
        out=pipeline.out, study=pipeline.name, jobs=jobs,
        devices=tuple(gpus) if gpus is not None else None,
        options=dict(cfg.get(kind) or {})))


def _resources(values: Mapping[str, Any], overrides: Mapping[str, Any], where: str,
               path: Path, gpus_here: int | None) -> res.Resources:
    """The resources a job gets: the pipeline's, then the command line's; a run that
    does not say how many GPUs gets one where the executor has some."""
    merged = res.merge(values, overrides)
    if merged.get("gpus") is None and where.startswith("run ") and gpus_here:
        merged["gpus"] = 1
    return res.build(merged, where, path)


def work_items(pipeline: Pipeline, state: PipelineState, stages: Sequence[Stage],
               todo: Sequence[RunSpec], runs: Sequence[RunSpec], options: RunOptions,
               gpus_here: int | None, board: RunBoard) -> list[WorkItem]:
    """The jobs to submit: data stages to make, runs to train or evaluate, analyses
    to run, each after the jobs it needs (dependencies first)."""
    shared = res.without_run_shape(pipeline.resources)
    items: list[WorkItem] = []
    for stage in stages:
        if not stage_done(state, stage):
            items.append(WorkItem(
                f"stage:{stage.name}", f"data stage '{stage.name}'",
                StageTask(pipeline.out, stage),
                _resources(res.merge(shared, stage.resources), options.resources,
                           f"datasets.{stage.name}", pipeline.path, gpus_here)))
    made = {str(s.output): f"stage:{s.name}" for s in stages if not stage_done(state, s)}
    for run in todo:
        inputs = {str(run.train.get("data"))} | {str(e.data) for e in run.evaluations if e.data}
        after = tuple(sorted({made[p] for p in inputs if p in made}))
        items.append(WorkItem(f"run:{run.label}", run.label, RunTask(pipeline.out, run),
                              _resources(run.resources, options.resources,
                                         f"run {run.label}", pipeline.path, gpus_here),
                              after))
    submitted = {i.key for i in items}
    items += _analysis_items(pipeline, state, runs, made, submitted, options, gpus_here,
                             board)
    return items


def _analysis_items(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec],
                    made: Mapping[str, str], submitted: set[str], options: RunOptions,
                    gpus_here: int | None, board: RunBoard) -> list[WorkItem]:
    """The analyses not done with this command and these data files. One that reads a
    run outside --only/--exclude waits for a run of the whole grid (on a part of its
    runs it would write a different result under the same name)."""
    selected = {r.label for r in runs}
    shared = res.without_run_shape(pipeline.resources)
    items = []
    for analysis in pipeline.analyses:
        reads = analysis_runs(analysis, pipeline.runs)
        outside = [r.label for r in reads if r.label not in selected]
        if outside:
            board.note(f"analysis '{analysis.name}' not run: it reads {len(outside)} "
                       f"run(s) outside the selection ({outside[0]}, ...)")
            continue
        task = analysis_task(pipeline.out, analysis, pipeline.runs,
                             list(pipeline.stages.values()), pipeline.path)
        names = " ".join(analysis.command)
        after = {f"run:{r.label}" for r in reads} & submitted
        after |= {key for output, key in made.items() if output in names}
        if not after and _analysis_done(task, state):
            continue
        items.append(WorkItem(f"analysis:{analysis.name}", f"analysis '{analysis.name}'",
                              task, _resources(res.merge(shared, analysis.resources),
                                               options.resources,
                                               f"analyses.{analysis.name}", pipeline.path,
                                               gpus_here), tuple(sorted(after))))
    return items


def _analysis_done(task: Any, state: PipelineState) -> bool:
    try:
        return task.done(state)
    except CapsmedError:
        return False


def run_pipeline(pipeline: Pipeline, options: RunOptions) -> int:
    """Run what is not finished; returns the exit code (1 if anything failed)."""
    state = PipelineState(pipeline.out)
    runs = select_runs(pipeline, options.only, options.exclude)
    if not runs:
        raise CapsmedError(f"{pipeline.path}: no run matches the selection")
    stages = needed_stages(pipeline, runs)
    check_inputs(pipeline, stages, state)
    executor = executor_for(pipeline, options)
    started = time.monotonic()
    board = RunBoard(pipeline.name, len(runs))
    todo = []
    for run, _, status in plan(pipeline, runs, state):
        if status == "done":
            board.event("done", run.label, "finished earlier")
        else:
            todo.append(run)
    items = work_items(pipeline, state, stages, todo, runs, options,
                       executor.gpus_available(), board)
    executor.check(items)
    state.acquire_lock()
    failures: dict[str, str] = {}
    try:
        with board:
            driver = Driver(executor, items, options.retries,
                            lambda item, st: _outcome(state, item, st),
                            lambda what, item, detail: _show(board, what, item, detail))
            try:
                driver.start()
                failures = {driver.tracked[k].item.label: why
                            for k, why in driver.wait().items()}
            finally:
                executor.close()
        if options.report:  # over every finished run of the grid, not just the selection
            from capsmed.pipeline.study import write_study_report

            written = write_study_report(pipeline, state, pipeline.runs)
            board.note(f"report: {written}" if written else "no study report: no run of "
                       "this pipeline is evaluated yet (any earlier study.md was removed)")
    finally:
        state.release_lock()
    board.summary(failures, time.monotonic() - started, state)
    return 1 if failures else 0


def _outcome(state: PipelineState, item: WorkItem, job: JobState) -> str | None:
    """None when the item's work is done, by its files; else why not."""
    if item.kind == "run":
        run = item.task.run
        run_id = current_identity(run, set())
        if run_id is not None and state.status(run, run_id) == "done":
            return None
        if job.reason:
            return job.reason
        where = state.log_path(run, run_id) if run_id else state.out / "logs"
        return f"ended without finishing; see {where}"
    return job.reason if job.state != "finished" else None


def _show(board: RunBoard, what: str, item: WorkItem, detail: str | None) -> None:
    if item.kind == "run":
        board.event(what, item.label, detail)
    elif what == "running":
        output = getattr(item.task, "stage", None) or getattr(item.task, "analysis", None)
        target = getattr(output, "output", None)
        board.note(f"{item.label}" + (f" -> {target}" if target else "")
                   + (f" ({detail})" if detail else ""))
    elif what == "failed":
        board.note(f"{item.label} FAILED: {detail}")


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
