"""Where a pipeline's runs stand, read from the files they leave (never the scheduler).

Layout under the pipeline's ``out`` folder:

* ``runs/<label>-<id>/``: one run directory per run (``capsmed train`` + ``evaluate``);
* ``data/``: what the data stages make (by convention; the YAML names the paths);
* ``logs/<label>-<id>.log``: every attempt's output;
* ``.capsmed-run/``: the runner's own records (run configs, attempt counts, the
  running markers and the lock that keeps two runners off one folder).

A run's identity (:func:`run_identity`) hashes its resolved options and the content
digest of its input file, so a run whose options or data change gets a new folder and
is trained again, while an unchanged one is found finished and skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.pipeline.spec import RunSpec

# Options that change how fast a run goes or where it writes, not what it computes.
NOT_IDENTITY = frozenset({"out", "device", "data_loading", "loader_workers", "tensorboard",
                          "compile", "channels_last", "eval_batch_size"})
STATES = ("pending", "started", "interrupted", "trained", "running", "failed", "done")


def _digest_or_path(value: str | None) -> str | None:
    if value is None:
        return None
    return file_digest(Path(value)) if Path(value).is_file() else None


def run_identity(run: RunSpec) -> str | None:
    """12 hex digits of a hash of the run's options and input digests; None while its
    data file does not exist yet (a data stage will make it)."""
    data = _digest_or_path(run.train.get("data"))
    if data is None:
        return None
    evaluations = []
    for e in run.evaluations:
        other = _digest_or_path(e.data) if e.data else None
        if e.data and other is None:
            return None
        evaluations.append({**{k: v for k, v in dataclasses.asdict(e).items()
                               if k != "batch_size"}, "data": other})  # speed only
    train = {k: v for k, v in run.train.items() if k not in NOT_IDENTITY and k != "data"}
    payload = json.dumps({"train": train, "data": data, "evaluate": evaluations},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


class PipelineState:
    """The files of one pipeline's ``out`` folder."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.records = self.out / ".capsmed-run"

    def run_dir(self, run: RunSpec, run_id: str) -> Path:
        return self.out / "runs" / f"{run.label}-{run_id}"

    def log_path(self, run: RunSpec, run_id: str) -> Path:
        return self.out / "logs" / f"{run.label}-{run_id}.log"

    def config_path(self, run_id: str) -> Path:
        return self.records / "configs" / f"{run_id}.yaml"

    def _record_path(self, run_id: str) -> Path:
        return self.records / "runs" / f"{run_id}.json"

    def read_record(self, run_id: str) -> dict[str, Any]:
        path = self._record_path(run_id)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def write_record(self, run_id: str, **fields: Any) -> None:
        record = {**self.read_record(run_id), **fields, "updated": time.time()}
        write_text_atomic(self._record_path(run_id), json.dumps(record, indent=1) + "\n")

    def status(self, run: RunSpec, run_id: str | None) -> str:
        """pending / started / interrupted / trained / running / failed / done."""
        if run_id is None:
            return "pending"
        run_dir = self.run_dir(run, run_id)
        if (run_dir / "summary.json").is_file():
            if all((run_dir / e.name / "report.json").is_file() for e in run.evaluations):
                return "done"
            state = "trained"
        elif (run_dir / "resume.pt").is_file():
            state = "interrupted"
        elif run_dir.exists():
            state = "started"
        else:
            state = "pending"
        if self.running_on(run_id):
            return "running"
        return "failed" if self.read_record(run_id).get("outcome") == "failed" else state

    # -- markers of runs in progress, so `capsmed run status` can tell them apart --------
    def _marker(self, run_id: str) -> Path:
        return self.records / "running" / run_id

    def mark_running(self, run_id: str) -> None:
        write_text_atomic(self._marker(run_id), json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(),
             "job": os.environ.get("SLURM_JOB_ID"), "since": time.time()}))

    def clear_running(self, run_id: str) -> None:
        self._marker(run_id).unlink(missing_ok=True)

    def running_on(self, run_id: str) -> str | None:
        """The host a run is in progress on, or None (a marker of a dead process is
        stale: on this host the pid is checked; elsewhere it is trusted)."""
        try:
            info = json.loads(self._marker(run_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if info.get("host") == socket.gethostname() and not info.get("job") \
                and not _alive(int(info.get("pid", 0))):
            return None
        return str(info.get("host"))

    # -- one runner per folder -------------------------------------------------------------
    def acquire_lock(self) -> None:
        lock = self.records / "runner.lock"
        try:
            info = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = {}
        if info and info.get("host") == socket.gethostname() and _alive(int(info["pid"])) \
                and int(info["pid"]) != os.getpid():
            raise CapsmedError(f"{self.out}: another capsmed run (pid {info['pid']}) is "
                               "running this pipeline; wait for it, or see: capsmed run "
                               "status PIPELINE")
        write_text_atomic(lock, json.dumps({"host": socket.gethostname(),
                                            "pid": os.getpid()}))

    def release_lock(self) -> None:
        (self.records / "runner.lock").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
