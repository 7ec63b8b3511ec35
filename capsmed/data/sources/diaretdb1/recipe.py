"""``capsmed predict`` on a DIARETDB1 run: CLAHE on LAB lightness, the green channel,
windows inside the field of view (the official mask, or one estimated per image)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from capsmed.data.record import DatasetRecord
from capsmed.data.replay.images import PatchRecipe, recorded
from capsmed.data.replay.options import Overrides
from capsmed.data.sources.diaretdb1.layout import read_fundus_mask
from capsmed.data.sources.diaretdb1.reader import enhance_fundus
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


def estimate_fov(rgb: np.ndarray, threshold: int = 20) -> np.ndarray:
    """A fundus photograph's field of view (bool): the largest bright region (any
    channel above ``threshold``) with its holes filled; the surround is black."""
    bright = (rgb.max(axis=-1) > threshold).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(bright, connectivity=8)
    if n < 2:
        return np.zeros(rgb.shape[:2], dtype=bool)
    largest = (labels == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))).astype(np.uint8)
    contours, _ = cv2.findContours(largest, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    filled = np.zeros_like(largest)
    cv2.drawContours(filled, contours, -1, 1, thickness=cv2.FILLED)
    return filled.astype(bool)


class FundusPatches(PatchRecipe):
    """DIARETDB1: CLAHE green over the field of view, windows inside it."""

    accepts = frozenset({"stride", "min_tissue", "fov_mask"})
    pads_edges = False  # training clipped its centres: every window inside the image

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        super().__init__(record, overrides)
        if overrides.fov_mask is None:  # training read the set's released mask
            log.warning("the field of view is estimated per image: at a soft rim it can "
                        "differ from a released mask by a pixel, which moves the CLAHE box "
                        "and changes the patches; for photographs that come with a mask "
                        "(DIARETDB1's fmask.tif) pass --fov-mask (fov_mask= in Python) to "
                        "see them as training did")

    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:

        given = self.overrides.fov_mask
        mask = read_fundus_mask(given) if given else estimate_fov(rgb)
        if mask.shape != rgb.shape[:2]:
            raise CapsmedError(f"{path}: image is {rgb.shape[1]}x{rgb.shape[0]} but the "
                               f"field-of-view mask {given} is {mask.shape[1]}x{mask.shape[0]}")
        if not mask.any():
            raise CapsmedError(f"{path}: no field of view found (a black image?); pass "
                               "--fov-mask")
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
        green = enhance_fundus(rgb, mask, box, float(recorded(self.record, "clip_limit")),
                               tuple(recorded(self.record, "tile_grid")))
        needed = self.overrides.min_tissue
        needed = float(recorded(self.record, "min_fov") if needed is None else needed)
        notes = {"fov_mask": str(given) if given else
                 "estimated: largest region brighter than 20, holes filled"}
        return green, mask, needed, notes
