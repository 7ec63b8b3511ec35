"""Follow a study's jobs: re-attach to the live ones the ledger names, submit the rest,
wait for them with the board showing where they are, and check each ending against
the files (a run is done only when its folder says so)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from capsmed.errors import CapsmedError, shell_quoted
from capsmed.pipeline.display import RunBoard
from capsmed.pipeline.drive import Driver
from capsmed.pipeline.execute import current_identity, stage_done
from capsmed.pipeline.executors import create_executor
from capsmed.pipeline.executors.base import Executor
from capsmed.pipeline.ledger import Ledger, job_states, live_only, task_identity
from capsmed.pipeline.spec import Pipeline
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.status import RunStarts
from capsmed.pipeline.work import FAILED, Job, JobState, WorkItem


def poller(executor: Executor) -> Callable[[str, Sequence[Job]], dict[str, JobState]]:
    """Ask the executor that holds each job (a study's ledger may name another one)."""
    def poll(name: str, jobs: Sequence[Job]) -> dict[str, JobState]:
        if name == executor.name:
            return executor.poll(jobs)
        return create_executor(name, executor.settings).poll(jobs)
    return poll


def attach(state: PipelineState, executor: Executor) -> dict[str, Job]:
    """The study's jobs that are still queued or running (key -> job), from one poll;
    the ends of the others are written to the ledger."""
    ledger = Ledger(state.records)
    open_jobs = ledger.open_jobs()
    if not open_jobs:
        return {}
    states = job_states(open_jobs, poller(executor))
    for key, st in states.items():
        if not st.live:
            ledger.ended(open_jobs[key], st)
    live = live_only(open_jobs, states)
    other = sorted({j.executor for j in live.values()} - {executor.name})
    if other:
        raise CapsmedError(f"{state.out}: jobs of this study are still queued or running "
                           f"in the {other[0]} executor: rerun with --executor {other[0]} "
                           "to re-attach to them, or wait for them (capsmed run wait "
                           "PIPELINE)")
    return live


SUPERSEDED = "superseded: its work changed, or a job it waited for, since it was submitted"


def superseded(state: PipelineState, items: Sequence[WorkItem], live: Mapping[str, Job],
               submitting: bool = True) -> dict[str, Job]:
    """The ``live`` jobs (key -> job) that no longer do their item's work: a job runs
    what it was given at submission, so one whose run's options or data, or whose data
    stage's or analysis's commands, changed since; and one that waits for such a job
    or, when ``submitting``, for an item submitted again (its old job ended: Slurm
    would start this one after that one, or cancel it)."""
    entries = Ledger(state.records).entries()
    starts = RunStarts(state)
    redo = {i.key for i in items if (i.key not in live and submitting)
            or (i.key in live and i.key in entries
                and not starts.ran(entries[i.key], task_identity(i)))}
    waiting = redo
    while waiting:
        waiting = {i.key for i in items if i.key in live and i.key not in redo
                   and set(i.after) & redo}
        redo |= waiting
    return {i.key: live[i.key] for i in items if i.key in redo and i.key in live}


def ledger_executor(state: PipelineState) -> str | None:
    """The executor of the study's most recent jobs no runner saw end, if any."""
    entries = [e for e in Ledger(state.records).entries().values() if e.ended is None]
    return max(entries, key=lambda e: e.submitted).job.executor if entries else None


def follow(pipeline: Pipeline, state: PipelineState, executor: Executor,
            items: Sequence[WorkItem], options: Any, board: RunBoard,
            submit: bool = True) -> dict[str, str] | None:
    """Attach to the live jobs of ``items``, submit the others (``submit``), and wait
    for them all; None when detached (after submitting)."""
    ledger = Ledger(state.records)
    live = attach(state, executor)
    mine = {k: j for k, j in live.items() if k in {i.key for i in items}}
    stale = superseded(state, items, mine, submit)
    mine = {k: j for k, j in mine.items() if k not in stale}
    if not submit:
        items = [i for i in items if i.key in mine]
    driver = Driver(executor, items, options.retries if submit else 0,
                    lambda item, st: outcome(state, item, st),
                    lambda what, item, detail: show(board, what, item, detail),
                    submitted=ledger.submitted, ended=ledger.ended)
    with board:
        if stale and submit:  # never this study's result: stopped, and submitted anew
            executor.cancel(list(stale.values()))
            for job in stale.values():
                ledger.ended(job, JobState(FAILED, SUPERSEDED))
            board.note(f"cancelled {len(stale)} job(s) whose work (options, data, "
                       "commands) or a job they waited for changed since they were "
                       "submitted; submitting them again")
        elif stale:
            board.note(f"not following {len(stale)} job(s) whose work or a job they "
                       "waited for changed since they were submitted (capsmed run "
                       f"{pipeline.path} replaces them)")
        new = driver.start(mine)
        if mine:
            board.note(f"re-attached to {len(mine)} job(s) submitted earlier")
        if options.detach and submit:
            board.note(f"submitted {len(new)} job(s) to {executor.name}; see where they "
                       f"stand with: capsmed run status {shell_quoted(pipeline.path)}; wait "
                       "for them and write the report with: capsmed run wait "
                       f"{shell_quoted(pipeline.path)}")
            return None
        failures = driver.wait()
    return {driver.tracked[k].item.label: why for k, why in failures.items()}


def write_report(pipeline: Pipeline, state: PipelineState, board: RunBoard) -> None:
    """The study's tables, over every finished run of the grid (not just a selection)."""
    from capsmed.pipeline.study import write_study_report

    written = write_study_report(pipeline, state, pipeline.runs)
    state.index().save()
    board.note(f"report: {written}" if written else "no study report: no run of this "
               "pipeline is evaluated yet (any earlier study.md was removed)")


def outcome(state: PipelineState, item: WorkItem, job: JobState) -> str | None:
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
    if item.kind == "stage" and not stage_done(state, item.task.stage):
        return job.reason or "ended without making its output"
    return job.reason if job.state != "finished" else None


def show(board: RunBoard, what: str, item: WorkItem, detail: str | None) -> None:
    if item.kind == "run":
        board.event(what, item.label, detail)
    elif what == "running":
        output = getattr(item.task, "stage", None) or getattr(item.task, "analysis", None)
        target = getattr(output, "output", None)
        board.note(f"{item.label}" + (f" -> {target}" if target else "")
                   + (f" ({detail})" if detail else ""))
    elif what == "failed":
        board.note(f"{item.label} FAILED: {detail}")
