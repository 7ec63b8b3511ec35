"""Where a study stands: one row per run, from its files, the job ledger and one poll of
the executor that holds its live jobs; then grouped, so that 10,000 runs read as a
page (``--list`` gives every row).

A run is ``finished`` (its folder says so), ``running`` or ``queued`` (a live job),
``failed`` (its last job ended without finishing it; the reason is the task's, else
the scheduler's) or ``not submitted`` (with what its folder holds: interrupted,
trained but not evaluated, or its data still to be made).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capsmed.pipeline.ledger import Entry, Ledger, job_states
from capsmed.pipeline.spec import RunSpec
from capsmed.pipeline.state import PipelineState
from capsmed.pipeline.work import FAILED, QUEUED, RUNNING, Job, JobState

FINISHED, NOT_SUBMITTED = "finished", "not submitted"
ORDER = (FINISHED, RUNNING, QUEUED, FAILED, NOT_SUBMITTED)
REPETITIONS = ("seed", "fold")  # fields a group is summed over first
WAITING = {"pending": "", "started": "", "interrupted": "interrupted, resumes",
           "trained": "trained, not evaluated", "outdated": "its data will be made again",
           "damaged": "its weights are damaged: trains again",
           "stale": "its transfer source was trained again: trains again"}


@dataclass
class RunRow:
    run: RunSpec
    run_id: str | None
    status: str
    detail: str = ""

    @property
    def label(self) -> str:
        return self.run.label


Plan = Sequence[tuple[RunSpec, str | None, str]]
Poll = Callable[[str, Sequence[Job]], dict[str, JobState]]


@dataclass(frozen=True)
class JobsNow:
    """The ledger's latest job of each work item (key -> entry) and where its open
    ones stand now (key -> state), from one poll of each executor."""

    entries: dict[str, Entry]
    states: dict[str, JobState]


def jobs_now(state: PipelineState, poll: Poll | None) -> JobsNow:
    """``poll`` asks executors about the ledger's open jobs (None: the ledger's own
    record only, as a dry run reads it)."""
    entries = Ledger(state.records).entries()
    open_jobs = {k: e.job for k, e in entries.items() if e.ended is None}
    states = job_states(open_jobs, poll) if open_jobs and poll is not None else {}
    return JobsNow(entries, states)


def run_rows(state: PipelineState, planned: Plan, jobs: JobsNow) -> list[RunRow]:
    """One row per planned run (``runner.plan``)."""
    started = RunStarts(state)
    rows = []
    for run, run_id, status in planned:
        key = f"run:{run.label}"
        entry = jobs.entries.get(key)
        if entry is not None and not started.ran(entry, run_id):
            entry = None  # the label's latest job ran another identity (other options)
        rows.append(_row(state, run, run_id, status, entry,
                         jobs.states.get(key) if entry is not None else None))
    return rows


class RunStarts:
    """Which identity a ledger job ran: the one it recorded at submission, else the
    one of its label whose record started after the job was submitted."""

    def __init__(self, state: PipelineState) -> None:
        self.state = state
        self._by_label: dict[str, list[tuple[str, float]]] | None = None

    def ran(self, entry: Entry, run_id: str | None) -> bool:
        if entry.identity is not None or run_id is None:
            return entry.identity in (None, run_id)
        later = {rid for rid, t in self._starts().get(entry.label, [])
                 if t >= entry.submitted}
        return not later or run_id in later

    def _starts(self) -> dict[str, list[tuple[str, float]]]:
        if self._by_label is None:  # read once, and only when a job recorded no identity
            self._by_label = {}
            for path in (self.state.records / "runs").glob("*.json"):
                record = self.state.read_record(path.stem)
                if record.get("started") is not None:
                    self._by_label.setdefault(str(record.get("label")), []).append(
                        (path.stem, float(record["started"])))
        return self._by_label


def _row(state: PipelineState, run: RunSpec, run_id: str | None, files: str,
         entry: Entry | None, now: JobState | None) -> RunRow:
    if files == "done":
        return RunRow(run, run_id, FINISHED)
    job = entry.job.job_id if entry is not None else ""
    if now is not None and now.live:
        detail = f"job {job}" + (f", {now.reason}" if now.reason else "")
        return RunRow(run, run_id, now.state, detail)
    ended = now or (entry.ended if entry is not None else None)
    if ended is not None and ended.state == FAILED:
        return RunRow(run, run_id, FAILED, ended.reason or f"job {job} failed")
    if files == "failed":
        record = state.read_record(run_id) if run_id else {}
        return RunRow(run, run_id, FAILED, str(record.get("reason") or "failed"))
    return RunRow(run, run_id, NOT_SUBMITTED, WAITING.get(files, files))


def counts(rows: Sequence[RunRow]) -> dict[str, int]:
    out = {s: 0 for s in ORDER}
    for row in rows:
        out[row.status] = out.get(row.status, 0) + 1
    return {s: n for s, n in out.items() if n}


def describe_counts(found: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in found.items())


def group_fields(runs: Sequence[RunSpec], most: int = 24) -> list[str]:
    """The grid fields a summary groups by: every field but the repetitions, then,
    while there are more than ``most`` groups, without the field of most values."""
    fields = list(dict.fromkeys(k for r in runs for k in r.fields if k not in REPETITIONS))
    while len(fields) > 1:
        groups = {tuple(str(r.fields.get(f)) for f in fields) for r in runs}
        if len(groups) <= most:
            break
        widest = max(fields[::-1], key=lambda f: len({str(r.fields.get(f)) for r in runs}))
        fields.remove(widest)
    return fields


def grouped(rows: Sequence[RunRow], fields: Sequence[str]) -> dict[str, list[RunRow]]:
    """Rows by their values of ``fields`` (``tupac16 capsnet``), in grid order."""
    out: dict[str, list[RunRow]] = {}
    for row in rows:
        key = " ".join(str(row.run.fields.get(f, "-")) for f in fields) or "all runs"
        out.setdefault(key, []).append(row)
    return out


def stage_lines(stages: Sequence[Any], jobs: JobsNow, done: Callable[[Any], bool]
                ) -> list[str]:
    """One line per data stage, for status: made, its job as the executor sees it now
    (as the run rows read theirs), failed with the reason, or to make."""
    lines = []
    for stage in stages:
        key = f"stage:{stage.name}"
        entry, now = jobs.entries.get(key), jobs.states.get(key)
        job = entry.job.job_id if entry is not None else ""
        ended = now or (entry.ended if entry is not None else None)
        if done(stage):
            what = "made"
        elif now is not None and now.live:
            what = f"{now.state}, job {job}" + (f", {now.reason}" if now.reason else "")
        elif entry is not None and ended is None:
            what = f"job {job}"  # not asked (a dry run), or no answer
        elif ended is not None and ended.state == FAILED:
            what = f"failed: {ended.reason or f'job {job} failed'}"
        else:
            what = "to make"
        lines.append(f"data stage {stage.name}: {what}")
    return lines
