"""The rows of a run's data that ``capsmed evaluate`` and the analyses score.

A run on train / val / test splits is tested on its file's ``test`` split. A
cross-validation run (``--fold K``) is tested on its held-out fold: the rows
training saved in ``test_indices.npy``, checked to be disjoint from the
``train_indices.npy`` it trained on. Those row numbers only mean something in the file
the run was trained on (same content digest); any other file is scored whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsmed.data.contract import SplitData, load_split
from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError, first_line
from capsmed.train.run_config import CONFIG, read_run_config
from capsmed.train.run_data import CV_SPLIT, TEST_ROWS, TRAIN_ROWS


def load_run_split(run_dir: Path, data: Path, split: str) -> SplitData:
    """The samples ``capsmed evaluate`` uses for ``split`` of a run.

    For a cross-validation run on its own file, ``test`` means the run's held-out fold
    rows (saved in ``test_indices.npy``); anything else, and any other file, is the
    file's split as is (the fold's row numbers mean nothing in another file).
    """
    test_rows = Path(run_dir) / TEST_ROWS
    if split == "test" and not test_rows.is_file() and _is_fold_run(run_dir) \
            and is_run_file(run_dir, data):
        raise CapsmedError(f"{test_rows}: missing; this cross-validation run's held-out "
                           "rows are kept there (train the fold again to restore them)")
    if split == "test" and test_rows.is_file() and is_run_file(run_dir, data):
        whole = load_split(data, CV_SPLIT)
        rows = read_rows(test_rows, len(whole), f"{data}'s split '{CV_SPLIT}'")
        trained = Path(run_dir) / TRAIN_ROWS
        if trained.is_file():
            seen = np.intersect1d(rows, read_rows(trained, len(whole), f"{data}'s split "
                                                  f"'{CV_SPLIT}'"))
            if len(seen):
                raise CapsmedError(f"{test_rows}: {len(seen)} of its {len(rows)} test rows "
                                   f"are training rows of the run ({trained}); the files "
                                   "are not from one run")
        return SplitData(whole.images[rows], whole.labels[rows], whole.groups[rows])
    return load_split(data, split)


def _is_fold_run(run_dir: Path) -> bool:
    if not (Path(run_dir) / CONFIG).is_file():
        return False
    return (read_run_config(run_dir).get("train") or {}).get("fold") is not None


def is_run_file(run_dir: Path, data: Path) -> bool:
    """Whether ``data`` is the file the run was trained on: the content digest its
    ``config.yaml`` recorded (the path, for runs from before digests)."""
    config_path = Path(run_dir) / CONFIG
    if not config_path.is_file():
        return True  # no record to tell otherwise: the run's own rows, as always
    config = read_run_config(run_dir)
    saved = config.get("dataset", {}).get("digest")
    if saved is not None:
        return file_digest(Path(data)) == saved
    return Path(data).resolve() == Path(config["train"]["data"]).resolve()


def read_rows(path: Path, size: int, of: str) -> np.ndarray:
    """Row numbers saved by a run (``test_indices.npy``), checked to be what training
    wrote: a 1-D array of distinct integers within ``0..size-1``.

    Raises:
        CapsmedError: naming the file, if it is unreadable, pickled or out of range.
    """
    try:
        rows = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise CapsmedError(f"{path}: cannot read the saved rows ({first_line(exc)})"
                           ) from None
    if not isinstance(rows, np.ndarray) or rows.ndim != 1 or rows.dtype.kind not in "iu":
        shape = getattr(rows, "shape", "?")
        raise CapsmedError(f"{path}: expected a 1-D array of row numbers, got "
                           f"{getattr(rows, 'dtype', type(rows).__name__)} {shape}")
    if len(rows) == 0 or rows.min() < 0 or rows.max() >= size \
            or len(np.unique(rows)) != len(rows):
        raise CapsmedError(f"{path}: expected distinct row numbers within 0..{size - 1} "
                           f"of {of}; it holds {len(rows)} rows within "
                           f"{rows.min() if len(rows) else '-'}.."
                           f"{rows.max() if len(rows) else '-'}")
    return rows.astype(np.int64)
