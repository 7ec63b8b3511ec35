"""What ``capsmed run status`` and ``capsmed run --dry-run`` show: the study's runs and
where they stand, grouped, and for a dry run what each group asks for and how long
it should take."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsmed.pipeline.execute import stage_done
from capsmed.pipeline.follow import poller
from capsmed.pipeline.items import job_resources
from capsmed.pipeline.runner import (
    RunOptions,
    executor_for,
    foreign_run_dirs,
    needed_stages,
    plan,
    select_runs,
)
from capsmed.pipeline.spec import Pipeline, RunSpec
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.status import (
    RunRow,
    counts,
    group_fields,
    grouped,
    jobs_now,
    run_rows,
    stage_lines,
)


@dataclass
class Overview:
    pipeline: Pipeline
    runs: list[RunSpec]
    rows: list[RunRow]
    fields: list[str]
    groups: dict[str, list[RunRow]]
    stages: list[str]
    foreign: list[Path]
    resources: dict[str, str] = field(default_factory=dict)  # group -> resources
    estimates: dict[str, float] = field(default_factory=dict)  # run label -> seconds
    estimate_note: str = ""
    trained: set[str] = field(default_factory=set)  # labels with no training left


def study_overview(pipeline: Pipeline, options: RunOptions, dry_run: bool) -> Overview:
    """The runs ``options`` select, as they stand. A dry run asks no scheduler (it
    reads the ledger only) and adds each group's resources and time estimates."""
    state = PipelineState(pipeline.out).keep_digests()
    runs = select_runs(pipeline, options.only, options.exclude)
    executor = executor_for(pipeline, options)
    planned = plan(pipeline, runs, state)
    jobs = jobs_now(state, None if dry_run else poller(executor))  # one poll for both
    rows = run_rows(state, planned, jobs)
    fields = group_fields(runs)
    groups = grouped(rows, fields)
    stages = stage_lines(needed_stages(pipeline, runs), jobs, lambda s: stage_done(state, s))
    view = Overview(pipeline, runs, rows, fields, groups, stages,
                    foreign_run_dirs(pipeline, state))
    if dry_run:
        here = executor.gpus_available()
        for key, members in groups.items():
            kinds = dict.fromkeys(
                job_resources(r.run.resources, options.resources, f"run {r.label}",
                              pipeline.path, here, options.allow_cpu).describe()
                for r in members)
            view.resources[key] = " | ".join(kinds)
        view.trained = {run.label for run, run_id, status in planned
                        if _trained(state, run, run_id, status)}
        _estimates(view, planned, options, here)
    return view


def _trained(state: PipelineState, run: RunSpec, run_id: str | None, status: str) -> bool:
    """The run will not train again: it is trained (evaluated or not), or it failed
    after its training finished (only its evaluation runs again)."""
    if status in ("done", "trained"):
        return True
    from capsmed.train.run_config import training_unfinished

    return status == "failed" and run_id is not None \
        and training_unfinished(state.run_dir(run, run_id)) is None


def _estimates(view: Overview, planned: Sequence, options: RunOptions,
               gpus_here: int | None) -> None:
    """Training time of the runs still to train (a trained run is not trained again)."""
    from capsmed.pipeline.estimate import RATES, estimate_run, estimate_summary, user_rates

    rates = [*user_rates(), *RATES]
    found, shapes = {}, {}
    todo = [(run, run_id, status) for run, run_id, status in planned
            if run.label not in view.trained]
    for run, _, _ in todo:
        gpus = job_resources(run.resources, options.resources, f"run {run.label}",
                             view.pipeline.path, gpus_here, options.allow_cpu).gpus or 0
        estimate = estimate_run(view.pipeline, run, gpus, rates, shapes)
        if estimate is not None:
            found[run.label] = estimate
    view.estimates = {label: seconds for label, (seconds, _) in found.items()}
    view.estimate_note = estimate_summary(found, len(todo), len(planned) - len(todo))


def overview_record(view: Overview) -> dict[str, Any]:
    """``capsmed run status --json``: the study, its counts and each run with its
    grid fields, status and reason (empty where there is none), as the table shows
    them, unformatted."""
    return {
        "study": view.pipeline.name, "pipeline": str(view.pipeline.path),
        "out": str(view.pipeline.out), "counts": counts(view.rows),
        "runs": [{"label": r.label, "fields": dict(r.run.fields), "status": r.status,
                  "reason": r.detail, "run_id": r.run_id} for r in view.rows],
        "stages": view.stages, "foreign": [str(p) for p in view.foreign],
    }
