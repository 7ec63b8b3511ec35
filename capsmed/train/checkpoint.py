"""Writing a checkpoint: safetensors weights + a JSON of the architecture and its
arguments. Reading one back (checked against the run's other files) is
:mod:`capsmed.runs.checkpoint`'s job: this module reads back only the epoch of a
checkpoint, to put the one that goes with ``resume.pt`` back on ``--resume``, and the
weights file checked against its recorded digest (:func:`read_checked_weights`, which
layer transfer uses too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_weights
from safetensors.torch import save_file
from torch import nn

from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError, first_line
from capsmed.io import atomic_path, write_failure, writing
from capsmed.train.run_config import META, WEIGHTS

log = logging.getLogger(__name__)

# the checkpoint as it was when resume.pt was last written (hard links: no copy)
KEPT_WEIGHTS, KEPT_META = "resume-checkpoint.safetensors", "resume-checkpoint.json"
PAIRS = ((WEIGHTS, KEPT_WEIGHTS), (META, KEPT_META))


def save_checkpoint(run_dir: Path, model: nn.Module, meta: dict[str, Any]) -> None:
    """Write weights and metadata atomically (metadata last: it marks a complete pair).

    Both are written in full before either is renamed into place, so a failed write
    (a full disk) leaves the previous pair as it was.
    """
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    weights, meta_path = Path(run_dir) / WEIGHTS, Path(run_dir) / META
    # the inner block renames first: the weights, then the metadata
    with atomic_path(meta_path) as meta_tmp, atomic_path(weights) as weights_tmp:
        try:
            save_file(state, str(weights_tmp))
        except Exception as exc:  # safetensors' own error types, or OSError
            raise write_failure(weights, exc) from None
        # the pair belongs together: a weights file from elsewhere is caught on loading
        meta = {**meta, "weights_digest": file_digest(weights_tmp)}
        with writing(meta_path):
            meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True),
                                encoding="utf-8")


def keep_for_resume(run_dir: Path) -> None:
    """Keep the checkpoint as it is now, beside the ``resume.pt`` just written.

    A run that crashes after a later epoch was kept resumes from the earlier state;
    where its replay is not bit-identical (a GPU), it may not select that epoch again,
    and the crashed attempt's weights would pass for the resumed run's best.
    :func:`restore_for_resume` puts this pair back.
    """
    run_dir = Path(run_dir)
    for name, kept in PAIRS:  # the weights first, the metadata (which names the epoch) last
        if (run_dir / name).is_file():
            _link(run_dir / name, run_dir / kept)
        else:
            (run_dir / kept).unlink(missing_ok=True)


def restore_for_resume(run_dir: Path, best_epoch: int) -> None:
    """Make the checkpoint the one of ``best_epoch``, the epoch the resumed state kept
    (0: none yet), not one a crashed attempt wrote after that state."""
    run_dir = Path(run_dir)
    if best_epoch == 0:  # any checkpoint is the crashed attempt's: the replay decides
        for name, kept in PAIRS:
            (run_dir / name).unlink(missing_ok=True)
            (run_dir / kept).unlink(missing_ok=True)
        return
    if _epoch(run_dir / KEPT_META) == best_epoch:  # the pair kept with the state
        # put back even when the metadata already names that epoch: a crash between
        # save_checkpoint's two renames leaves a later epoch's weights beside it
        if not all(_same_file(run_dir / name, run_dir / kept) for name, kept in PAIRS):
            for name, kept in PAIRS:  # the metadata last: until it is in place, the
                # pair fails its weights digest on loading and the next --resume
                # restores it again
                _link(run_dir / kept, run_dir / name)
        return
    if _epoch(run_dir / META) != best_epoch:
        log.warning("%s: the checkpoint is of epoch %s, not of epoch %d that the resumed "
                    "state kept, which was not found beside it; it stays unless the "
                    "rest of the run keeps a better epoch", run_dir / META,
                    _epoch(run_dir / META), best_epoch)


def _link(source: Path, target: Path) -> None:
    """Put ``source`` at ``target`` atomically: a hard link where the file system has
    them (the checkpoint is replaced by renaming, so the link keeps the old file),
    else a copy."""
    with atomic_path(target) as tmp, writing(target):
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:  # no hard links here (some network and FAT file systems)
            shutil.copyfile(source, tmp)


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (hard links of it)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is missing
        return False


def drop_kept(run_dir: Path) -> None:
    """Remove the pair :func:`keep_for_resume` keeps (the run finished)."""
    for _, kept in PAIRS:
        (Path(run_dir) / kept).unlink(missing_ok=True)


def _epoch(meta_path: Path) -> int | None:
    """The epoch a checkpoint metadata file names (None: no file, or unreadable)."""
    try:
        epoch = json.loads(meta_path.read_text(encoding="utf-8")).get("epoch")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return epoch if isinstance(epoch, int) else None


def read_checked_weights(path: Path, recorded: str | None) -> tuple[bytes, str]:
    """A checkpoint's weights file read once, and its ``sha256:`` digest, refused unless
    it is the ``recorded`` digest (None: not recorded): the bytes checked are the bytes
    loaded (training may replace the file between a digest and a second read, which
    scored epoch N+1 under epoch N's metadata)."""
    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise CapsmedError(f"{path}: cannot read ({exc.strerror})") from None
    digest = f"sha256:{hashlib.sha256(blob).hexdigest()}"  # as file_digest writes it
    if recorded not in (None, digest):
        raise CapsmedError(f"{path}: not the weights {META} was written with (their "
                           "digests differ): the two files come from different "
                           "checkpoints")
    return blob, digest


def parse_weights(blob: bytes, path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes (``path`` names it in errors)."""
    try:
        return load_weights(blob)
    except Exception as exc:  # safetensors raises its own error types on corrupt files
        raise CapsmedError(f"{path}: cannot read weights ({first_line(exc)})") from None
