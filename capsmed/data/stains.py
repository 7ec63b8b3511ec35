"""Stain separation for H&E histology (Ruifrok-Johnston colour deconvolution).

We use scikit-image's ``rgb2hed`` (the published Ruifrok-Johnston stain matrix) rather
than fitting a Vahadane normaliser: it needs no SPAMS, no reference image, and is the
same for every slide, so the scaling recorded in the dataset file is the whole story.
"""

from __future__ import annotations

import cv2
import numpy as np
from skimage.color import rgb2hed

from capsmed.data.sources.common import DEFAULT_H_MAX


def hematoxylin_density(rgb: np.ndarray) -> np.ndarray:
    """Hematoxylin concentration per pixel (float32, >= 0) from an RGB uint8 image."""
    return np.clip(rgb2hed(rgb)[..., 0], 0.0, None).astype(np.float32)


def hematoxylin_channel(rgb: np.ndarray, h_max: float = DEFAULT_H_MAX) -> np.ndarray:
    """The hematoxylin channel as a uint8 transmitted-light image (dark = dense stain).

    Mapping (fixed, recorded in the dataset): ``255 * (1 - clip(H / h_max, 0, 1))``,
    which looks like the hematoxylin-only image a microscope would show.
    """
    h = hematoxylin_density(rgb)
    return np.round(255.0 * (1.0 - np.clip(h / h_max, 0.0, 1.0))).astype(np.uint8)


def tissue_mask(rgb: np.ndarray, od_threshold: float = 0.15, smooth: int = 15) -> np.ndarray:
    """Boolean mask of stained tissue: mean optical density above ``od_threshold``.

    Glass, lumen and fat transmit almost all light (OD ~ 0); a box blur of ``smooth``
    pixels stops single noisy pixels from counting as tissue.
    """
    od = -np.log((rgb[..., :3].astype(np.float32) + 1.0) / 256.0).mean(axis=-1)
    if smooth > 1:
        od = cv2.blur(od, (smooth, smooth))
    return od > od_threshold
