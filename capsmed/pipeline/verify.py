"""A finished run's weights, checked before the runner counts it as done.

Training records the digest of its weights in ``checkpoint.json``. A run folder whose
``checkpoint.safetensors`` no longer has that digest (cut short by a full disk, a bad
copy, an edit) is not finished, whatever its other files say. The check reads the
weights once: the study's ``.capsmed-run/verified.jsonl`` then keeps the file's size,
modification time, inode and change time, and a file whose stat is unchanged is not
read again (the job that trained the run fills it in as it ends).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError
from capsmed.runs.checkpoint import checkpoint_meta
from capsmed.train.run_config import WEIGHTS


class Verified:
    """The study's record of weights files found whole."""

    def __init__(self, records: Path) -> None:
        self.path = Path(records) / "verified.jsonl"
        self._known: dict[str, list[int]] | None = None

    def _load(self) -> dict[str, list[int]]:
        if self._known is None:
            self._known = {}
            with contextlib.suppress(OSError):
                for line in self.path.read_text(encoding="utf-8").splitlines():
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        entry = json.loads(line)
                        self._known[str(entry["run"])] = list(entry["stat"])
        return self._known

    def problem(self, run_dir: Path) -> str | None:
        """None when ``run_dir``'s weights are the ones its training recorded; else why
        not, in words."""
        weights = Path(run_dir) / WEIGHTS
        try:
            st = weights.stat()
        except OSError:
            return f"{weights} is missing"
        # the change time too: a checkpoint copied in place with its old times (cp -p
        # of another run of the same architecture) keeps size, mtime and inode
        stat = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        known = self._load().get(str(run_dir))
        if known == stat or known == stat[:3]:  # 3: recorded before the change time
            return None
        try:
            recorded = checkpoint_meta(run_dir).get("weights_digest")
        except CapsmedError as exc:
            return str(exc)
        if recorded and file_digest(weights) != recorded:
            return (f"{weights} is damaged ({st.st_size} bytes, not the weights its "
                    "training recorded)")
        self._load()[str(run_dir)] = stat
        # not kept (a read-only folder): checked again next time
        with contextlib.suppress(OSError), self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"run": str(run_dir), "stat": stat}) + "\n")
        return None
