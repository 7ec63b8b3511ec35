"""Which run folders and reports a pipeline's study (study.md, study.html, claims,
curves) reads: the runs the pipeline now names, finished and intact, and their reports
as the pipeline now asks for them; never folders or reports left by an earlier version
of the pipeline file."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from capsmed.evaluate.aggregate import EvaluatedRun
from capsmed.pipeline.execute import current_identity, remade_outputs
from capsmed.pipeline.spec import Pipeline, RunSpec
from capsmed.pipeline.state import PipelineState, evaluation_current

log = logging.getLogger(__name__)


def current_dirs(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec]
                 ) -> list[tuple[RunSpec, Path]]:
    """The folder of each run that has an identity now (its data made and current) and
    holds its finished training: not interrupted, its weights the ones training
    recorded, its transfer source not trained again since (what ``capsmed run status``
    counts as trained; any other folder trains again, and its old files are not this
    pipeline's results)."""
    from capsmed.train.run_config import training_unfinished

    remade = remade_outputs(pipeline, state)
    return [(r, run_dir) for r in runs
            if (run_id := current_identity(r, remade)) is not None
            and training_unfinished(run_dir := state.run_dir(r, run_id)) is None
            and not state.damaged(run_dir) and not state.stale_transfer(r, run_dir)]


def _evaluation_current(run: RunSpec, run_dir: Path, evaluation: str) -> bool:
    """The run's evaluation ``evaluation`` is there as the pipeline now asks for it (its
    split, data, Agr, the weights kept): a report left by an earlier version of the
    file (another split) is not read, as ``capsmed run`` evaluates it again."""
    chosen = [e for e in run.evaluations if e.name == evaluation]
    return bool(chosen) and evaluation_current(run_dir, chosen[0])


def evaluated(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec],
              evaluation: str) -> list[tuple[RunSpec, EvaluatedRun]]:
    """The current runs' current reports of ``evaluation``, as the study index holds
    them."""
    return [(run, state.index().evaluated(run_dir, evaluation))  # the study index
            for run, run_dir in current_dirs(pipeline, state, runs)
            if (run_dir / evaluation / "report.json").is_file()
            and _evaluation_current(run, run_dir, evaluation)]


def warn_unread(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec]) -> None:
    """Say once how many run folders hold reports the study does not read."""
    old = sum(1 for run, run_dir in current_dirs(pipeline, state, runs)
              if any((run_dir / e.name / "report.json").is_file()
                     and not evaluation_current(run_dir, e) for e in run.evaluations))
    if old:
        log.warning("%s: %d run folder(s) hold an evaluation that is not the one the "
                    "pipeline now asks for (another split, data or checkpoint); not read "
                    "(capsmed run evaluates them again)", pipeline.path, old)


def any_evaluated(pipeline: Pipeline, state: PipelineState, runs: Sequence[RunSpec]
                  ) -> bool:
    """Whether any current run holds a current report of any of its evaluations."""
    return any(evaluation_current(run_dir, e)
               for run, run_dir in current_dirs(pipeline, state, runs)
               for e in run.evaluations)
