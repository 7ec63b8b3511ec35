"""Stain separation for H&E histology (Ruifrok-Johnston colour deconvolution), and the
tissue mask, from one look-up per pixel.

We use scikit-image's Ruifrok-Johnston stain matrix (``skimage.color.hed_from_rgb``,
what ``rgb2hed`` applies) rather than fitting a Vahadane normaliser: it needs no SPAMS,
no reference image, and is the same for every slide, so the scaling recorded in the
dataset file is the whole story.

Both the deconvolution and the tissue mask take the logarithm of every pixel's
channels. An 8-bit channel has 256 values, so each logarithm is looked up in a table
made once with the very expressions ``rgb2hed`` and the mask evaluate: the results are
bit-identical to theirs (tests/test_stains.py), and the two logarithm passes over the
image, most of the time TUPAC16's preprocessing spent, are gone.
"""

from __future__ import annotations

import cv2
import numpy as np
from skimage.color import hed_from_rgb
from skimage.util import img_as_float

from capsmed.data.sources.common import DEFAULT_H_MAX

# rgb2hed's optical density of each 8-bit value: log(max(v, 1e-6)) / log(1e-6) of the
# value as img_as_float scales it (not v / 255: that differs in the last bit)
_HED_OD = (np.log(np.maximum(img_as_float(np.arange(256, dtype=np.uint8)), 1e-6))
           / np.log(1e-6))
# the tissue mask's optical density: -log((v + 1) / 256), in float32
_MASK_OD = -np.log((np.arange(256, dtype=np.float32) + 1.0) / 256.0)


def _lookup(rgb: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[rgb[..., :3]]``, looked up by OpenCV (about twice as fast as indexing)."""
    # a grey (H, W) image would pass, its first 3 columns taken for channels
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[-1] < 3:
        raise ValueError("stain separation needs an (H, W, 3) uint8 RGB image, got "
                         f"{rgb.dtype} of shape {list(rgb.shape)}")
    return cv2.LUT(np.ascontiguousarray(rgb[..., :3]), table)


def hematoxylin_density(rgb: np.ndarray) -> np.ndarray:
    """Hematoxylin concentration per pixel (float32, >= 0) from an RGB uint8 image:
    ``rgb2hed(rgb)[..., 0]``, computed as ``rgb2hed`` does from looked-up densities
    (the same (H, W, 3) @ (3, 3) product: a column alone rounds differently)."""
    stains = _lookup(rgb, _HED_OD) @ hed_from_rgb
    return np.clip(stains[..., 0], 0.0, None).astype(np.float32)


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
    # the mean as numpy's float32 mean over the channel axis computes it: (r + g + b) / 3
    od = _lookup(rgb, _MASK_OD)
    od = (od[..., 0] + od[..., 1] + od[..., 2]) / np.float32(3)
    if smooth > 1:
        od = cv2.blur(od, (smooth, smooth))
    return od > od_threshold
