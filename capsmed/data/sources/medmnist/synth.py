"""A small synthetic MedMNIST file in exactly the published layout.

``OUT_DIR/<set>.npz`` (``<set>_<size>.npz`` above 28 px) holds the six arrays a
published file holds, with the published dtypes and shapes: ``{train,val,test}_images``
uint8 [N, H, W] (grey sets) or [N, H, W, 3] (RGB sets) and ``{train,val,test}_labels``
uint8 [N, 1]. Each image is one round "cell" on a noisy background whose radius and
brightness (and, in colour sets, tint) follow its class, so a classifier can learn
the classes whatever the orientation: the cytology and histology recipes rotate and
flip, which would erase a class told by orientation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsmed.data.sources.medmnist.sets import SETS, SINGLE_LABEL, SIZES
from capsmed.errors import CapsmedError
from capsmed.io import atomic_path, ensure_writable_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MedmnistSynthSummary:
    """What :func:`write_medmnist` wrote."""

    path: Path
    counts: dict[str, int]


def draw_cells(rng: np.random.Generator, labels: np.ndarray, classes: int, size: int,
               channels: int) -> np.ndarray:
    """Images uint8 [N, size, size(, 3)] of one class-coded disc each."""
    n = len(labels)
    share = labels / max(1, classes - 1)  # 0..1 along the classes
    radius = size * (0.12 + 0.3 * share) + rng.uniform(-0.02, 0.02, n) * size
    centre = size / 2 + rng.uniform(-0.06, 0.06, (n, 2)) * size
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    distance = np.hypot(yy[None] - centre[:, 0, None, None], xx[None] - centre[:, 1, None, None])
    inside = 1 / (1 + np.exp((distance - radius[:, None, None]) * 2.0))  # soft edge
    level = 70 + 150 * share
    grey = 30 + inside * (level[:, None, None] - 30)
    if channels == 1:
        image = grey + rng.normal(0, 8, grey.shape)
    else:
        hue = 2 * np.pi * share
        tint = 0.6 + 0.4 * np.stack([np.cos(hue), np.cos(hue - 2.1), np.cos(hue + 2.1)], 1)
        image = grey[..., None] * tint[:, None, None, :] + rng.normal(0, 8, (*grey.shape, 3))
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def write_medmnist(out_dir: Path, *, set_name: str = "bloodmnist", size: int = 28,
                   train: int = 240, val: int = 40, test: int = 80, seed: int = 0,
                   disable_progress: bool | None = None) -> MedmnistSynthSummary:
    """Write ``out_dir/<set>[_<size>].npz`` (atomically; deterministic for a seed).

    Args:
        out_dir: Folder to write into (created; other files in it are left alone).
        set_name: A single-label 2D set (its classes and channels are used).
        size: Image side: 28, 64, 128 or 224.
        train, val, test: Images per split (every class appears once a split holds
            as many images as there are classes).
        seed: Random seed.
        disable_progress: Unused (one quick file); kept for the common call.

    Returns:
        The file written and its split sizes.
    """
    out_dir = Path(out_dir)
    if set_name not in SINGLE_LABEL:
        raise CapsmedError(f"{out_dir}: cannot synthesise {set_name!r}: choose a "
                           f"single-label 2D set ({', '.join(SINGLE_LABEL)})")
    if size not in SIZES:
        raise CapsmedError(f"{out_dir}: size must be one of {', '.join(map(str, SIZES))}, "
                           f"got {size}")
    counts = {"train": train, "val": val, "test": test}
    if any(not 1 <= c <= 100_000 for c in counts.values()):
        raise CapsmedError(f"{out_dir}: each split needs 1-100000 images, got "
                           + ", ".join(f"{k}={v}" for k, v in counts.items()))
    if seed < 0:  # NumPy's generator failed on it with a traceback, the folder made
        raise CapsmedError(f"{out_dir}: seed must be >= 0, got {seed}")
    chosen = SETS[set_name]
    ensure_writable_dir(out_dir)
    path = out_dir / chosen.file_name(size)
    if path.exists():
        raise CapsmedError(f"{path}: already exists; remove it or choose another folder")
    arrays = {}
    for code, (split, count) in enumerate(counts.items()):
        rng = np.random.default_rng([seed, code])
        labels = rng.permutation(np.arange(count) % len(chosen.classes))
        arrays[f"{split}_images"] = draw_cells(rng, labels, len(chosen.classes), size,
                                               chosen.channels)
        arrays[f"{split}_labels"] = labels.astype(np.uint8)[:, None]
    with atomic_path(path) as tmp, tmp.open("wb") as fh:
        np.savez_compressed(fh, **arrays)
    log.info("wrote %s (%s)", path, ", ".join(f"{k}={v}" for k, v in counts.items()))
    return MedmnistSynthSummary(path, counts)
