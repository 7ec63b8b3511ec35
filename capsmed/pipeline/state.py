"""Where a pipeline's runs stand, read from the files they leave (never the scheduler).

Layout under the pipeline's ``out`` folder:

* ``runs/<label>-<id>/``: one run directory per run (``capsmed train`` + ``evaluate``);
* ``data/``: what the data stages make (by convention; the YAML names the paths);
* ``logs/<label>-<id>.log``: every attempt's output;
* ``.capsmed-run/``: the runner's own records (run configs, attempt counts, the
  running markers and the lock that keeps two runners off one folder).

A run's identity (:func:`capsmed.pipeline.identity.run_identity`) hashes its resolved
options and the content digest of its input file, so a run whose options or data change
gets a new folder and is trained again, while an unchanged one is found finished and
skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.pipeline.spec import RunSpec

log = logging.getLogger(__name__)

STATES = ("pending", "outdated", "started", "interrupted", "trained", "running", "failed",
          "done")


class PipelineState:
    """The files of one pipeline's ``out`` folder."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.records = self.out / ".capsmed-run"
        self._lock_token: str | None = None  # set while this object holds the lock

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
        """The host a run is in progress on, or None. A killed process leaves its
        marker behind, so a marker is checked where it can be: on this host its pid,
        in Slurm its job (squeue). One from another host outside Slurm is trusted."""
        try:
            info = json.loads(self._marker(run_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        host, job = str(info.get("host")), info.get("job")
        if host == socket.gethostname():
            return host if _alive(int(info.get("pid", 0) or 0)) else None
        if not job:
            return host
        alive = slurm_job_alive(str(job))
        if alive is None:
            log.warning("run %s is marked running in Slurm job %s on %s, which cannot be "
                        "checked here (no squeue): its files decide its status", run_id,
                        job, host)
        return host if alive else None

    # -- one runner per folder -------------------------------------------------------------
    def acquire_lock(self) -> None:
        """Take the folder for this runner. The lock file is created atomically
        (O_EXCL), so of two runners starting at once exactly one gets it; one left by a
        dead runner on this host is taken over; one from another host cannot be
        checked, so it is refused with the way to remove it."""
        lock = self.records / "runner.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        mine = {"host": socket.gethostname(), "pid": os.getpid(),
                "token": secrets.token_hex(8), "since": time.time()}
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse_or_break(lock)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(mine))
            self._lock_token = mine["token"]
            return
        raise CapsmedError(f"{lock}: another runner keeps taking this lock; wait for it")

    def _refuse_or_break(self, lock: Path) -> None:
        info = _read_lock(lock)
        if info is None:
            return  # removed meanwhile: try again
        host, pid = str(info.get("host")), int(info.get("pid", 0) or 0)
        if host == socket.gethostname() and (pid == os.getpid() or not _alive(pid)):
            _remove_stale(lock, info)  # its runner is gone (or was this process)
        elif host == socket.gethostname():
            raise CapsmedError(f"{self.out}: another capsmed run (pid {pid}) is running "
                               "this pipeline; wait for it, or see: capsmed run status "
                               "PIPELINE")
        else:
            raise CapsmedError(f"{self.out}: another capsmed run (host {host}, pid {pid}) "
                               "holds this folder; wait for it (capsmed run status "
                               f"PIPELINE), or, if it is gone, delete {lock}")

    def release_lock(self) -> None:
        """Remove the lock if it is still this runner's (never another runner's)."""
        lock = self.records / "runner.lock"
        info = _read_lock(lock) or {}
        if self._lock_token is not None and info.get("token") == self._lock_token:
            lock.unlink(missing_ok=True)
        self._lock_token = None


def _read_lock(lock: Path) -> dict | None:
    """The lock's contents; None if it is gone. A lock being written (empty) is waited
    for a moment; one that stays unreadable is refused."""
    for _ in range(20):
        try:
            text = lock.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        with contextlib.suppress(ValueError):
            info = json.loads(text)
            if isinstance(info, dict):
                return info
        time.sleep(0.05)
    raise CapsmedError(f"{lock}: unreadable runner lock; if no capsmed run uses this "
                       "folder, delete it")


def _remove_stale(lock: Path, info: dict) -> None:
    """Remove a dead runner's lock, and only that: moved aside first, a lock another
    runner made in between is put back."""
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}")
    try:
        os.replace(lock, aside)
    except FileNotFoundError:
        return
    if _read_lock(aside) != info:
        with contextlib.suppress(OSError):
            os.link(aside, lock)
    aside.unlink(missing_ok=True)


def slurm_job_alive(job: str) -> bool | None:
    """Whether Slurm still holds ``job`` (pending, running, requeued); None when this
    machine cannot tell (no squeue, or squeue failed)."""
    if shutil.which("squeue") is None:
        return None
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:  # a job Slurm has forgotten is an error, not an empty list
        return False if "invalid job id" in proc.stderr.lower() else None
    return bool(proc.stdout.strip())


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
