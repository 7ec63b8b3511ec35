"""What a recipe hands the scorer: one input's windows, cut chunk by chunk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from capsmed.errors import CapsmedError

CHUNK = 256  # windows cut at a time: bounds memory on big images and feeds progress bars
THUMBNAIL_SIDE = 1024  # long side of the picture under a heatmap


@dataclass
class Prepared:
    """One input, read: its size and its windows in chunks of (model inputs uint8
    [n, C, H, W], centres int64 [n, 2] as (x, y) in level-0 px)."""

    size: tuple[int, int]  # (width, height), level-0 px
    footprint: float  # window side, level-0 px
    chunks: Iterator[tuple[np.ndarray, np.ndarray]]
    expected: int | None  # windows to come (None: found on the way, e.g. slide regions)
    thumbnail: np.ndarray | None = None
    windowed: bool = True
    notes: dict[str, Any] = field(default_factory=dict)


def thumbnail(rgb: np.ndarray) -> np.ndarray:
    """An RGB picture of ``rgb`` at most :data:`THUMBNAIL_SIDE` px on its long side."""
    h, w = rgb.shape[:2]
    scale = min(1.0, THUMBNAIL_SIDE / max(h, w))
    if scale == 1.0:
        return rgb
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


def in_chunks(centres: np.ndarray, cut: Callable[[np.ndarray], np.ndarray]
              ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(cut(part), part)`` for consecutive parts of :data:`CHUNK` centres."""
    for start in range(0, len(centres), CHUNK):
        part = centres[start:start + CHUNK]
        yield cut(part), part


def check_centres(path: Any, centres: np.ndarray, w: int, h: int, what: str = "image"
                  ) -> np.ndarray:
    """Given (x, y) centres as int64 (K, 2), refused unless all lie inside ``w`` x ``h``
    level-0 px: a window outside would be scored on blank padding."""
    xy = np.asarray(centres, dtype=np.int64).reshape(-1, 2)
    outside = (xy < 0).any(axis=1) | (xy[:, 0] >= w) | (xy[:, 1] >= h)
    if outside.any():
        x, y = xy[np.argmax(outside)].tolist()
        raise CapsmedError(f"{path}: centre x={x}, y={y} lies outside the {w}x{h} {what}")
    return xy


def check_windows_inside(path: Any, rc: np.ndarray, size: int, w: int, h: int) -> None:
    """Refuse (row, col) centres ``rc`` whose ``size`` window reaches past the ``w`` x
    ``h`` image: a run whose training windows all lay inside it (DIARETDB1 clipped its
    centres in) never saw the mirrored pixels a padded window holds."""
    half = size // 2
    outside = ((rc < half).any(axis=1) | (rc[:, 0] - half + size > h)
               | (rc[:, 1] - half + size > w))
    if outside.any():
        y, x = rc[np.argmax(outside)].tolist()
        raise CapsmedError(f"{path}: the {size} px window centred on x={x}, y={y} reaches "
                           f"past the {w}x{h} image, and this run's training windows all "
                           f"lay inside their images; give centres {half} to "
                           f"{w - size + half} (x) and {half} to {h - size + half} (y)")
