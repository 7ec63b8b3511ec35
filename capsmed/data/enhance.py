"""Contrast enhancement for colour photographs (fundus images first of all).

Paper 000 enhances DIARETDB1 fundus images with CLAHE (contrast limited adaptive
histogram equalisation) on the lightness of the Lab colour space, converts back to RGB
and keeps the green channel, where red lesions (haemorrhages, microaneurysms) are dark
and exudates bright against the retina. OpenCV's CLAHE and colour conversions do the
work; this module only fixes the order of the steps and their parameters.
"""

from __future__ import annotations

import cv2
import numpy as np

from capsmed.data.sources.common import DEFAULT_CLIP_LIMIT, DEFAULT_TILE_GRID


def clahe_lab(rgb: np.ndarray, clip_limit: float = DEFAULT_CLIP_LIMIT,
              tile_grid: tuple[int, int] = DEFAULT_TILE_GRID) -> np.ndarray:
    """CLAHE on the L channel of Lab, then back to RGB.

    Equalising lightness only leaves hue and saturation alone, so lesion colours keep
    their meaning while local contrast rises.

    Args:
        rgb: (H, W, 3) uint8 RGB image.
        clip_limit: OpenCV CLAHE clip limit (contrast amplification cap per tile).
        tile_grid: Number of tiles as (rows, cols).

    Returns:
        (H, W, 3) uint8 RGB image.
    """
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {rgb.dtype} {rgb.shape}")
    lab = cv2.cvtColor(rgb, cv2.COLOR_RGB2LAB)
    rows, cols = tile_grid
    # OpenCV takes tileGridSize as (width, height) = (cols, rows).
    clahe = cv2.createCLAHE(clipLimit=float(clip_limit), tileGridSize=(int(cols), int(rows)))
    lab[..., 0] = clahe.apply(np.ascontiguousarray(lab[..., 0]))
    return cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)


def clahe_green(rgb: np.ndarray, clip_limit: float = DEFAULT_CLIP_LIMIT,
                tile_grid: tuple[int, int] = DEFAULT_TILE_GRID) -> np.ndarray:
    """Paper 000's fundus enhancement: CLAHE on Lab lightness -> RGB -> green channel.

    Args:
        rgb: (H, W, 3) uint8 RGB image.
        clip_limit: OpenCV CLAHE clip limit.
        tile_grid: Number of tiles as (rows, cols).

    Returns:
        (H, W) uint8 green channel of the enhanced image.
    """
    return np.ascontiguousarray(clahe_lab(rgb, clip_limit, tile_grid)[..., 1])
