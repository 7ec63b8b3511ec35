"""A run's identity: one hash of what its training computes, so a changed run gets a new
folder.

What it computes is its training options, the content of its data file
(:func:`capsmed.data.digest.dataset_digest`: the arrays and the preprocessing
record, not the file's bytes or when it was written) and capsmed's
:data:`~capsmed.train.protocol.PROTOCOL_REVISION`: after a capsmed change that alters
what the same options compute, finished runs of the older code are not taken as done.
Evaluations and analyses are not part of it: adding an evaluation evaluates the
finished runs, it does not train them again.

The same payload serves twice: with the content digests of the ``.h5`` files
(:func:`run_identity`, the folder name) and, when the file is read, with their paths
(:func:`capsmed.pipeline.checks.check_distinct_runs`), so that two grid points that
would train the very same run are refused before anything runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from capsmed.data.digest import dataset_digest
from capsmed.train.protocol import PROTOCOL_REVISION, SESSION_OPTIONS


class RunLike(Protocol):
    """What identity and the checks read of a :class:`capsmed.pipeline.spec.RunSpec`
    (a protocol, so that spec, which runs the checks, need not be imported here)."""

    fields: dict[str, Any]
    label: str
    train: dict[str, Any]
    evaluations: tuple[Any, ...]


def identity_payload(run: RunLike, digest: Callable[[str], str | None]
                     ) -> dict[str, Any] | None:
    """What a run's training computes: its options and ``digest`` of its data file;
    None when ``digest`` knows no value for it yet."""
    data = digest(str(run.train.get("data")))
    if data is None:
        return None
    train = {k: v for k, v in run.train.items() if k not in SESSION_OPTIONS and k != "data"}
    return {"train": train, "data": data, "revision": PROTOCOL_REVISION}


def _digest_or_none(value: str) -> str | None:
    return dataset_digest(Path(value)) if Path(value).is_file() else None


# id(run) -> (run, its identity payload with the data digest left as a marker): a grid
# of 10,000 runs is hashed many times per command (status, the report's tables)
_PAYLOADS: dict[int, tuple[RunLike, int, str]] = {}
_DATA = "\0data\0"


def run_identity(run: RunLike) -> str | None:
    """12 hex digits of a hash of the run's options and data content; None while its
    data file does not exist yet (a data stage will make it)."""
    data = _digest_or_none(str(run.train.get("data")))
    if data is None:
        return None
    known = _PAYLOADS.get(id(run))
    if known is None or known[0] is not run or known[1] != PROTOCOL_REVISION:
        payload = identity_payload(run, lambda path: _DATA)
        known = (run, PROTOCOL_REVISION, json.dumps(payload, sort_keys=True, default=str))
        _PAYLOADS[id(run)] = known
    text = known[2].replace(json.dumps(_DATA), json.dumps(data), 1)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
