"""A pipeline as a batch of work items: the data stages to make, the runs to train or
evaluate and the analyses to run, each with its resources and the items it waits for
(a run after the data stages it reads, an analysis after its runs and data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline import resources as res
from capsmed.pipeline.execute import analysis_runs, stage_done
from capsmed.pipeline.spec import Pipeline, RunSpec, Stage
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.tasks import RunTask, StageTask, analysis_task
from capsmed.pipeline.work import WorkItem

Note = Any  # a callable taking one line of text (the runner's board)


def job_resources(values: Mapping[str, Any], overrides: Mapping[str, Any], where: str,
                  path: Path, gpus_here: int | None, allow_cpu: bool = False
                  ) -> res.Resources:
    """What a job gets: the pipeline's resources, then the command line's. A run that
    does not say how many GPUs gets one where the executor has some; with
    ``allow_cpu`` one that asks for GPUs the executor cannot give trains without."""
    merged = res.merge(values, overrides)
    if merged.get("gpus") is None and where.startswith("run ") and gpus_here is not None:
        merged["gpus"] = 1 if gpus_here else 0
    if allow_cpu and merged.get("gpus") and gpus_here is not None \
            and merged["gpus"] > gpus_here:
        merged = {**merged, "gpus": 0}
    return res.build(merged, where, path)


def stage_item(pipeline: Pipeline, stage: Stage, overrides: Mapping[str, Any],
               gpus_here: int | None) -> WorkItem:
    shared = res.without_run_shape(pipeline.resources)
    return WorkItem(f"stage:{stage.name}", f"data stage '{stage.name}'",
                    StageTask(pipeline.out, stage),
                    job_resources(res.merge(shared, stage.resources), overrides,
                                  f"datasets.{stage.name}", pipeline.path, gpus_here))


def run_item(pipeline: Pipeline, run: RunSpec, after: Sequence[str],
             overrides: Mapping[str, Any], gpus_here: int | None, allow_cpu: bool
             ) -> WorkItem:
    return WorkItem(f"run:{run.label}", run.label, RunTask(pipeline.out, run),
                    job_resources(run.resources, overrides, f"run {run.label}",
                                  pipeline.path, gpus_here, allow_cpu), tuple(after))


def run_inputs(run: RunSpec) -> set[str]:
    """The data files a run reads: its own and those its evaluations score."""
    return {str(run.train.get("data"))} | {str(e.data) for e in run.evaluations if e.data}


def work_items(pipeline: Pipeline, state: PipelineState, stages: Sequence[Stage],
               todo: Sequence[RunSpec], runs: Sequence[RunSpec],
               overrides: Mapping[str, Any], gpus_here: int | None, note: Note,
               allow_cpu: bool = False) -> list[WorkItem]:
    """The jobs to submit, dependencies first: the ``stages`` not made, the ``todo``
    runs, and the analyses not done (``runs``: the selection)."""
    made = {str(s.output): f"stage:{s.name}" for s in stages if not stage_done(state, s)}
    items = [stage_item(pipeline, s, overrides, gpus_here) for s in stages
             if f"stage:{s.name}" in made.values()]
    for run in todo:
        after = sorted({made[p] for p in run_inputs(run) if p in made})
        items.append(run_item(pipeline, run, after, overrides, gpus_here, allow_cpu))
    submitted = {i.key for i in items}
    items += analysis_items(pipeline, state, runs, made, submitted, overrides, gpus_here,
                            note)
    return items


def analysis_items(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec],
                   made: Mapping[str, str], submitted: set[str], overrides: Mapping[str, Any],
                   gpus_here: int | None, note: Note) -> list[WorkItem]:
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
            note(f"analysis '{analysis.name}' not run: it reads {len(outside)} "
                 f"run(s) outside the selection ({outside[0]}, ...)")
            continue
        task = analysis_task(pipeline.out, analysis, pipeline.runs,
                             list(pipeline.stages.values()), pipeline.path)
        words = " ".join(analysis.command)
        after = {f"run:{r.label}" for r in reads} & submitted
        after |= {key for output, key in made.items() if output in words}
        if not after and _done(task, state):
            continue
        items.append(WorkItem(
            f"analysis:{analysis.name}", f"analysis '{analysis.name}'", task,
            job_resources(res.merge(shared, analysis.resources), overrides,
                          f"analyses.{analysis.name}", pipeline.path, gpus_here),
            tuple(sorted(after))))
    return items


def _done(task: Any, state: PipelineState) -> bool:
    try:
        return task.done(state)
    except CapsmedError:
        return False
