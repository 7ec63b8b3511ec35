"""Resumable preprocessing: finished per-file results kept until the output is written.

A long preprocessing run (whole slides, thousands of images) that is interrupted or
fails on a late file should not redo the finished files. :class:`ResultCache` keeps
each finished job's result in ``.<output>.cache-<digest>/`` beside the output, where
the digest covers every preprocessing parameter, the list of raw files and capsmed's
:data:`~capsmed.data.schema.DATA_REVISION`: a rerun of the same command by the same
readers reuses them, any other command (or a capsmed whose readers make other images)
starts afresh. The folder is removed once the dataset file is in place, and after bad
input (which needs another command).

Each result is also keyed on the content of what its job read: the job's key (which
holds whatever the job carries, such as a slide's annotations) and the SHA-256 of
every input file (an image and its ground-truth CSV), taken when the job ran and
compared when it is reused. A result whose image, CSV, mask or annotations changed
since, even to the same size, is computed again instead of reused.

Results are dataclasses of numpy arrays and plain values; they are stored with
``np.savez`` (arrays) plus JSON (the rest) and read back with ``allow_pickle=False``:
nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data import schema
from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError
from capsmed.io import atomic_path

log = logging.getLogger(__name__)

_JSON_KEY = "__fields_json__"
_INPUTS_KEY = "__inputs_json__"


def input_digests(paths: Sequence[Path]) -> dict[str, str]:
    """``{path: sha256}`` of the files a job reads (what its cached result depends on)."""
    return {str(p): file_digest(Path(p)) for p in paths}


def _plain(value: Any) -> Any:
    """numpy scalars / arrays inside containers -> JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a result cache")


class ResultCache:
    """Per-job results of one preprocessing command, on disk beside its output.

    Args:
        output: The dataset file being written.
        parameters: Everything that determines the results (config, file list...).
    """

    def __init__(self, output: Path, parameters: Any) -> None:
        # the data revision too: results of an older capsmed's readers (upgraded between
        # the interrupted run and its rerun) would enter a file stamped with the new one
        text = json.dumps({"parameters": parameters, "revision": schema.DATA_REVISION},
                          sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        output = Path(output)
        self.dir = output.parent / f".{output.name}.cache-{digest}"
        self.reused = 0

    def _path(self, key: str) -> Path:
        safe = hashlib.sha256(key.encode()).hexdigest()[:24]
        return self.dir / f"{safe}.npz"

    def get(self, key: str, result_type: type, inputs: Sequence[Path] = ()) -> Any | None:
        """The stored result for ``key``, or None: none stored, unreadable, or one of
        ``inputs`` differs from what the job read (its SHA-256 changed)."""
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                values = json.loads(str(data[_JSON_KEY]))
                read = json.loads(str(data[_INPUTS_KEY])) if _INPUTS_KEY in data.files else {}
                values.update({k: data[k] for k in data.files
                               if k not in (_JSON_KEY, _INPUTS_KEY)})
            result = result_type(**values)
        # BadZipFile / EOFError: an entry cut short (renamed into place before a power cut
        # wrote its blocks)
        except (OSError, ValueError, TypeError, KeyError, EOFError,
                zipfile.BadZipFile) as exc:
            log.warning("%s: unreadable cached result, recomputing (%s)", path, exc)
            return None
        now = input_digests(inputs)
        if read != now:
            changed = sorted(p for p in now.keys() | read.keys() if now.get(p) != read.get(p))
            log.info("%s: changed since the earlier run; recomputing", ", ".join(changed))
            return None
        self.reused += 1
        return result

    def put(self, key: str, result: Any, inputs: dict[str, str] | None = None) -> None:
        """Store a dataclass result (atomically) with the digests of the files it was
        computed from (:func:`input_digests`, taken when the job read them)."""
        arrays, plain = {}, {}
        for f in dataclasses.fields(result):
            value = getattr(result, f.name)
            if isinstance(value, np.ndarray):
                arrays[f.name] = value.astype(str) if value.dtype == object else value
            else:
                plain[f.name] = value
        self.dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(self._path(key), suffix=".npz") as tmp, tmp.open("wb") as fh:
            np.savez(fh, **arrays, **{_JSON_KEY: np.array(json.dumps(plain, default=_plain)),
                                      _INPUTS_KEY: np.array(json.dumps(inputs or {}))})

    def clear(self) -> None:
        """Remove the cache (the output is complete)."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ResultCache:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        """Keep the results only when the run was interrupted or crashed: after success
        nothing is left to resume, and bad input (a :class:`CapsmedError`) needs a changed
        command anyway, so no hidden folder is left behind. An interruption's message
        then says where the results are (the CLI prints it as its one error line)."""
        if exc is None or isinstance(exc, CapsmedError):
            self.clear()
        elif self.dir.is_dir():
            kept = f"finished results kept in {self.dir}; rerun the same command to continue"
            if isinstance(exc, KeyboardInterrupt):  # said on the one 'error:' line
                reason = f"{exc.args[0]}; " if exc.args else ""
                raise KeyboardInterrupt(f"{reason}{kept}") from None
            log.warning("stopped by %s: %s", type(exc).__name__, kept)
