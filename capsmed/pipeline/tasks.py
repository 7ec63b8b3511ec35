"""The tasks every executor runs: make a data stage, train and evaluate a run, run an
analysis. Each is a small picklable object (a Slurm job unpickles it on a compute
node) that reads from the files what is left to do and records its outcome in the
study's folder, so how it ended is known wherever it ran.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from capsmed.errors import CapsmedError
from capsmed.pipeline.execute import (
    INTERRUPTED_REASON,
    analysis_done,
    command_hash,
    execute_analysis,
    execute_run,
    execute_stage,
    expand_command,
    inputs_of,
)
from capsmed.pipeline.identity import run_identity
from capsmed.pipeline.spec import Analysis, RunSpec, Stage
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.work import Placement


@dataclass(frozen=True)
class StageTask:
    """Make one data stage's ``.h5``."""

    out: Path
    stage: Stage
    kind: ClassVar[str] = "stage"

    def __call__(self, placement: Placement) -> str | None:
        try:
            state = PipelineState(self.out).keep_digests()
            return execute_stage(state, self.stage, placement.env, placement.persistent)
        except CapsmedError as exc:  # a full disk while writing its record
            return str(exc)

    def identity(self) -> str:
        """Its commands: a job of other commands makes another file."""
        return command_hash(self.stage.commands)

    def progress(self) -> object:
        return None


@dataclass(frozen=True)
class RunTask:
    """Train (or resume) one run of the grid and write its evaluations.

    Its identity is taken when it starts: a run submitted before its data stage ran
    learns the digest of its data file only then."""

    out: Path
    run: RunSpec
    kind: ClassVar[str] = "run"

    def __call__(self, placement: Placement) -> str | None:
        try:
            return self._run(placement)
        except CapsmedError as exc:  # a full disk, an unreadable file: one line
            return str(exc)

    def _run(self, placement: Placement) -> str | None:
        state = PipelineState(self.out).keep_digests()
        run_id = run_identity(self.run)
        if run_id is None:
            return f"its data file {self.run.train.get('data')} does not exist"
        if placement.rank != 0:
            return execute_run(state, self.run, run_id, placement)
        attempts = int(state.read_record(run_id).get("attempts", 0)) + 1
        log = str(state.log_path(self.run, run_id))
        state.write_record(run_id, label=self.run.label, fields=self.run.fields,
                           attempts=attempts, outcome="running", reason=None, log=log,
                           job=os.environ.get("SLURM_JOB_ID"), started=time.time())
        try:
            reason = execute_run(state, self.run, run_id, placement)
        except CapsmedError as exc:  # e.g. a full disk while writing its config
            reason = str(exc)
        outcome = ("done" if reason is None else "interrupted"
                   if reason.startswith(INTERRUPTED_REASON) else "failed")
        state.write_record(run_id, outcome=outcome, reason=reason)
        if reason is None:
            _index(state, self.run, run_id)
        return reason

    def identity(self) -> str | None:
        """The run's identity as of now (None while its data file is not made)."""
        return run_identity(self.run)

    def progress(self) -> object:
        """The run's saved state: written at every epoch end and when the training is
        told to stop, so a new token means steps that a resume keeps."""
        state = PipelineState(self.out).keep_digests()
        run_id = run_identity(self.run)
        if run_id is None:
            return None
        run_dir = state.run_dir(self.run, run_id)
        if (run_dir / "summary.json").is_file():
            return "trained"
        try:
            stat = (run_dir / "resume.pt").stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)


def _index(state: PipelineState, run: RunSpec, run_id: str) -> None:
    """Add the finished run's evaluations to the study index (the report reads it)."""
    index = state.index()
    with contextlib.suppress(CapsmedError):  # a broken report: the report says so
        for e in run.evaluations:
            index.evaluated(state.run_dir(run, run_id), e.name)
    index.save()


@dataclass(frozen=True)
class AnalysisTask:
    """Run one analysis command over the folders of the runs it names (expanded when
    it starts, once those runs' data exist)."""

    out: Path
    analysis: Analysis
    runs: tuple[RunSpec, ...]  # the whole grid's (its {runs:...} filters pick from them)
    stages: tuple[Stage, ...]
    pipeline_path: Path
    kind: ClassVar[str] = "analysis"

    def argv(self, state: PipelineState) -> list[str]:
        return expand_command(self.analysis, self.runs, state, self.pipeline_path)

    def done(self, state: PipelineState) -> bool:
        argv = self.argv(state)
        return analysis_done(state, self.analysis, argv, inputs_of(self.stages, argv))

    def __call__(self, placement: Placement) -> str | None:
        state = PipelineState(self.out).keep_digests()
        try:
            argv = self.argv(state)
            return execute_analysis(state, self.analysis, argv,
                                    inputs_of(self.stages, argv), placement.env,
                                    placement.persistent)
        except CapsmedError as exc:
            return str(exc)

    def identity(self) -> str:
        """Its command as written (its runs' folders are filled in when it starts)."""
        return command_hash([self.analysis.command])

    def progress(self) -> object:
        return None


def analysis_task(out: Path, analysis: Analysis, runs: Sequence[RunSpec],
                  stages: Sequence[Stage], pipeline_path: Path) -> AnalysisTask:
    return AnalysisTask(Path(out), analysis, tuple(runs), tuple(stages), Path(pipeline_path))
