"""Where a pipeline's runs stand, read from the files they leave.

Layout under the pipeline's ``out`` folder:

* ``runs/<label>-<id>/``: one run directory per run (``capsmed train`` + ``evaluate``);
* ``data/``: what the data stages make (by convention; the YAML names the paths);
* ``logs/<label>-<id>.log``: every attempt's output;
* ``.capsmed-run/``: the runner's own records (run configs, each run's attempts and
  outcome, the job ledger, cached data digests, the study index, and the lock that
  keeps two runners off one folder).

A run's identity (:func:`capsmed.pipeline.identity.run_identity`) hashes its training
options and the content of its data file, so a run whose options or data change gets
a new folder and is trained again, while an unchanged one is found finished and
skipped. Whether a job is queued or running is the executor's to say (the ledger,
:mod:`capsmed.pipeline.ledger`); what a run's files hold is said here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from capsmed.data.digest import file_digest, keep_digests_in
from capsmed.errors import CapsmedError
from capsmed.io import write_text_atomic
from capsmed.pipeline.processes import orphans_of
from capsmed.pipeline.spec import RunSpec
from capsmed.processes import pid_alive

STATES = ("pending", "outdated", "started", "interrupted", "trained", "damaged", "stale",
          "failed", "done")


def evaluation_current(run_dir: Path, evaluation: Any) -> bool:
    """The evaluation's report exists, scored the weights the run keeps now and the split
    (and Agr) the pipeline now asks for and, when it scores another data file, was made
    from that file as it is now (a remade file, or changed options, are evaluated
    again)."""
    report = run_dir / evaluation.name / "report.json"
    if not report.is_file():
        return False
    try:
        made = json.loads(report.read_text(encoding="utf-8"))
        if made.get("split", evaluation.split) != evaluation.split \
                or ("agreement" in made) != bool(evaluation.agreement):
            return False
    except (OSError, ValueError, AttributeError):
        return False
    if made.get("weights_digest") not in (None, _weights_digest(run_dir)):
        return False  # the run was trained again (or its checkpoint replaced) since
    if not evaluation.data:
        return not made.get("other_data")  # an evaluation on other data, now the run's
    if not Path(evaluation.data).is_file():
        return False
    made_from = made.get("data_digest")
    return made_from is None or made_from == file_digest(Path(evaluation.data))


def _weights_digest(run_dir: Path) -> str | None:
    from capsmed.runs.checkpoint import checkpoint_meta

    try:
        return checkpoint_meta(run_dir).get("weights_digest")
    except CapsmedError:
        return None


class PipelineState:
    """The files of one pipeline's ``out`` folder."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.records = self.out / ".capsmed-run"
        self._lock_token: str | None = None  # set while this object holds the lock
        self._verified: Any = None
        self._index: Any = None

    def keep_digests(self) -> PipelineState:
        """Keep the data files' content digests in the study's records, so that a later
        process (status, a job, a rerun) does not read an unchanged file again."""
        keep_digests_in(self.records / "digests.jsonl")
        return self

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

    def index(self) -> Any:
        """The study index (:mod:`capsmed.pipeline.index`) of this folder's evaluated
        runs, read once per PipelineState."""
        if self._index is None:
            from capsmed.pipeline.index import StudyIndex

            self._index = StudyIndex(self.records)
        return self._index

    def damaged(self, run_dir: Path) -> str | None:
        """Why a trained run's weights are not the ones its training recorded, if so."""
        if self._verified is None:
            from capsmed.pipeline.verify import Verified

            self._verified = Verified(self.records)
        return self._verified.problem(run_dir)

    def status(self, run: RunSpec, run_id: str | None) -> str:
        """pending / started / interrupted / trained / damaged / stale / failed / done,
        from the files (damaged: trained, but its weights are not the ones recorded;
        stale: a transfer run whose source was trained again since)."""
        if run_id is None:
            return "pending"
        run_dir = self.run_dir(run, run_id)
        if ((run_dir / "summary.json").is_file() or (run_dir / "resume.pt").is_file()) \
                and self.stale_transfer(run, run_dir):
            return "stale"
        if (run_dir / "resume.pt").is_file():  # beside summary.json: killed finishing
            state = "interrupted"
        elif (run_dir / "summary.json").is_file():
            if self.damaged(run_dir):
                return "damaged"
            if all(evaluation_current(run_dir, e) for e in run.evaluations):
                return "done"
            state = "trained"
        elif run_dir.exists():
            state = "started"
        else:
            state = "pending"
        return "failed" if self.read_record(run_id).get("outcome") == "failed" else state

    def stale_transfer(self, run: RunSpec, run_dir: Path) -> str | None:
        """Why a transfer run's copied layers are no longer its source's, if so: the
        source folder (part of the run's identity by its path only) holds other weights
        than the digest its config.yaml recorded (trained again). A source that is gone
        or unreadable leaves the run as it is: it holds what it recorded copying."""
        source = run.train.get("transfer_from")
        if not source or not run.train.get("transfer_layers"):
            return None
        from capsmed.train.transfer import recorded_transfer

        try:
            recorded = recorded_transfer(run_dir)
        except CapsmedError:
            return None
        now = _weights_digest(Path(str(source)))
        if recorded is None or now is None or now == recorded["weights_digest"]:
            return None
        return (f"{source} was trained again since {run_dir} copied its layers (weights "
                f"digest {recorded['weights_digest'][:19]}, now {now[:19]})")

    # -- one runner per folder -------------------------------------------------------------
    def check_writable(self) -> None:
        """Make the runner's records folder and write a file there, or say in one line
        why the study's folder cannot be written (read-only, full, not ours), before
        anything runs or is started in the background."""
        try:
            self.records.mkdir(parents=True, exist_ok=True)
            probe = self.records / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CapsmedError(f"{self.out}: cannot write the study's folder "
                               f"({exc.strerror}); choose another with --set out=DIR"
                               ) from None

    def acquire_lock(self, wait_seconds: float | None = None,
                     on_wait: Any = None) -> None:
        """Take the folder for this runner. The lock file is created atomically
        (O_EXCL), so of two runners starting at once exactly one gets it; one left by a
        dead runner on this host is taken over; one from another host cannot be
        checked, so it is refused with the way to remove it. With ``wait_seconds``, a
        live runner's lock is waited for (checked that often; ``on_wait`` is told once)
        instead of refused."""
        lock = self.records / "runner.lock"
        self.check_writable()
        mine = {"host": socket.gethostname(), "pid": os.getpid(),
                "token": secrets.token_hex(8), "since": time.time()}
        told, attempts = False, 0
        while attempts < 3:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._refuse_or_break(lock, waiting=wait_seconds is not None)
                if holder is None:
                    attempts += 1
                    continue
                if on_wait is not None and not told:
                    on_wait(f"waiting for the runner that holds {self.out} ({holder})")
                    told = True
                time.sleep(wait_seconds or 0)
                continue
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(mine))
            except OSError as exc:  # a full disk: no empty lock may stay behind
                lock.unlink(missing_ok=True)
                raise CapsmedError(f"{lock}: cannot write ({exc.strerror}); make room "
                                   "and run again") from None
            self._lock_token = mine["token"]
            return
        raise CapsmedError(f"{lock}: another runner keeps taking this lock; wait for it")

    def _refuse_or_break(self, lock: Path, waiting: bool = False) -> str | None:
        """Break a dead runner's lock (None: try again); a live one on this host is
        refused, or named when ``waiting``; one from another host is refused."""
        info = _read_lock(lock)
        if info is None:
            return None  # removed meanwhile: try again
        host, pid = str(info.get("host")), int(info.get("pid", 0) or 0)
        here = host == socket.gethostname()
        orphans = orphans_of(pid) if here and pid != os.getpid() and pid > 0 \
            and not pid_alive(pid) else []
        if orphans and waiting:
            return f"the commands of runner pid {pid}, which is gone"
        if orphans:  # its trainings save and stop, or work on: either way, not twice
            raise CapsmedError(f"{self.out}: the runner that held this folder (pid {pid}) "
                               "is gone, but the commands it started (pid "
                               f"{', '.join(map(str, orphans))}) still run in its run "
                               "folders; wait until they have ended, then run again")
        if here and (pid == os.getpid() or not pid_alive(pid)):
            _remove_stale(lock, info)  # its runner is gone (or was this process)
            return None
        if host == socket.gethostname() and waiting:
            return f"pid {pid}"
        if host == socket.gethostname():
            raise CapsmedError(f"{self.out}: another capsmed run (pid {pid}) is running "
                               "this pipeline; wait for it (capsmed run wait PIPELINE), "
                               "or see: capsmed run status PIPELINE")
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


def lock_holder(lock: Path) -> int | None:
    """The pid of the runner of this host that holds ``lock``, if any."""
    try:
        info = json.loads(lock.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("host") != socket.gethostname():
        return None
    return int(info.get("pid", 0) or 0) or None


STALE_EMPTY_LOCK_S = 30.0  # a runner writes its lock within microseconds of making it


def _read_lock(lock: Path) -> dict | None:
    """The lock's contents; None if it is gone. A lock being written (empty) is waited
    for a moment; one that stays unreadable and is older than STALE_EMPTY_LOCK_S was
    left by a runner that died (or ran out of disk) while writing it: it is removed.
    A recent one that stays unreadable is refused."""
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
    with contextlib.suppress(OSError):
        if time.time() - lock.stat().st_mtime > STALE_EMPTY_LOCK_S:
            lock.unlink()
            return None
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

