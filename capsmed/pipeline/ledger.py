"""The job ledger: which job of which executor does each work item of a study.

``OUT/.capsmed-run/ledger.jsonl`` gets a line when a job is submitted and one when the
runner sees it end. Only a runner holding the study's lock writes it; anyone may read
it. A runner that starts again (after a crash, ``kill -9``, ``--detach``) reads the
jobs that have no end line, asks their executor about all of them at once, and
re-attaches to the live ones instead of submitting the work again. ``capsmed run
status`` reads it from any machine that sees the output folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from capsmed.io import append_line
from capsmed.pipeline.work import Job, JobState, WorkItem


@dataclass(frozen=True)
class Entry:
    """The latest job of one work item and, once seen, how it ended."""

    job: Job
    label: str
    kind: str
    submitted: float
    ended: JobState | None = None
    identity: str | None = None  # the run's, where it was known at submission


class Ledger:
    """The study's ``ledger.jsonl``."""

    def __init__(self, records: Path) -> None:
        self.path = Path(records) / "ledger.jsonl"

    def submitted(self, item: WorkItem, job: Job) -> None:
        line = {"key": item.key, "label": item.label, "kind": item.kind,
                "executor": job.executor, "job": job.job_id, "submitted": time.time()}
        identity = task_identity(item)
        self._append({**line, "identity": identity} if identity else line)

    def ended(self, job: Job, state: JobState) -> None:
        self._append({"key": job.key, "job": job.job_id, "state": state.state,
                      "reason": state.reason, "ended": time.time()})

    def _append(self, line: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_line(self.path, json.dumps(line))

    def entries(self) -> dict[str, Entry]:
        """Work item key -> its latest job (a partial last line, from a crash in the
        middle of a write, is skipped)."""
        out: dict[str, Entry] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return out
        for text in lines:
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if not isinstance(line, dict) or "key" not in line:
                continue
            key = str(line["key"])
            if "submitted" in line:
                identity = line.get("identity")
                out[key] = Entry(Job(key, str(line["executor"]), str(line["job"])),
                                 str(line.get("label", key)), str(line.get("kind", "")),
                                 float(line["submitted"]),
                                 identity=str(identity) if identity else None)
            elif key in out and out[key].job.job_id == str(line.get("job")):
                out[key] = replace(out[key], ended=JobState(str(line["state"]),
                                                            line.get("reason")))
        return out

    def open_jobs(self) -> dict[str, Job]:
        """Jobs no runner has seen end: key -> job."""
        return {k: e.job for k, e in self.entries().items() if e.ended is None}


def task_identity(item: WorkItem) -> str | None:
    """What the item's task does, as of now: a run's identity, a data stage's or an
    analysis's commands. None where it is not known yet: a run's data not made, or
    made again by the data stage it waits for (the file there now is the old data)."""
    if item.kind == "run" and item.after:
        return None
    return getattr(item.task, "identity", lambda: None)()


def by_executor(jobs: Mapping[str, Job]) -> dict[str, list[Job]]:
    out: dict[str, list[Job]] = {}
    for job in jobs.values():
        out.setdefault(job.executor, []).append(job)
    return out


def job_states(jobs: Mapping[str, Job], poll: Any) -> dict[str, JobState]:
    """key -> state of each job, one ``poll(executor_name, jobs)`` call per executor."""
    out: dict[str, JobState] = {}
    for name, group in by_executor(jobs).items():
        states = poll(name, group)
        out.update({job.key: states[job.job_id] for job in group if job.job_id in states})
    return out


def live_only(jobs: Mapping[str, Job], states: Mapping[str, JobState]) -> dict[str, Job]:
    return {k: j for k, j in jobs.items() if k in states and states[k].live}


def keys(items: Sequence[WorkItem]) -> set[str]:
    return {i.key for i in items}
