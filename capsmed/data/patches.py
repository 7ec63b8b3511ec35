"""Patch extraction and resizing shared by every patch-based source."""

from __future__ import annotations

import cv2
import numpy as np


def extract_patches(image: np.ndarray, centres: np.ndarray, size: int) -> np.ndarray:
    """Cut ``size`` x ``size`` patches centred on ``centres`` (K, 2) as (row, col).

    The image is reflect-padded so a centre near the border still yields a full
    patch with the point at its centre (pixel ``size // 2``). Centres must lie inside
    the image.

    Returns:
        Array (K, size, size[, C]) with the image's dtype.
    """
    centres = np.asarray(centres, dtype=np.int64).reshape(-1, 2)
    if len(centres) == 0:
        return np.empty((0, size, size, *image.shape[2:]), dtype=image.dtype)
    h, w = image.shape[:2]
    if (centres < 0).any() or (centres[:, 0] >= h).any() or (centres[:, 1] >= w).any():
        raise ValueError(f"patch centres must lie inside the {h}x{w} image")
    half = size // 2
    top, left = centres[:, 0] - half, centres[:, 1] - half
    if top.min() < 0 or left.min() < 0 or top.max() + size > h or left.max() + size > w:
        pad = [(half + 1, half + 1), (half + 1, half + 1)] + [(0, 0)] * (image.ndim - 2)
        image = np.pad(image, pad, mode="reflect")
        top, left = top + half + 1, left + half + 1
    # every window of the image as a view; indexing copies the chosen ones row by row
    windows = np.lib.stride_tricks.sliding_window_view(image, (size, size), axis=(0, 1))
    patches = windows[top, left]  # (K, [C,] size, size): the window axes come last
    return np.ascontiguousarray(np.moveaxis(patches, (-2, -1), (1, 2)))


def resize_patches(patches: np.ndarray, out_size: int) -> np.ndarray:
    """Resize (K, S, S[, C]) patches to ``out_size`` with area interpolation (anti-aliased)."""
    if patches.shape[1] == out_size and patches.shape[2] == out_size:
        return patches.copy()
    out = [cv2.resize(p, (out_size, out_size), interpolation=cv2.INTER_AREA) for p in patches]
    return np.stack(out) if out else np.empty((0, out_size, out_size, *patches.shape[3:]),
                                              dtype=patches.dtype)


def window_fraction(mask: np.ndarray, centres: np.ndarray, size: int) -> np.ndarray:
    """Fraction of True pixels of ``mask`` in each ``size`` window centred on ``centres``.

    Centres must keep the window inside the image. Uses an integral image: O(1) per window.
    """
    integral = (cv2.integral(np.ascontiguousarray(mask, dtype=np.uint8), sdepth=cv2.CV_32S)
                if mask.size < 2**31 else
                np.pad(mask.astype(np.int64), ((1, 0), (1, 0))).cumsum(0).cumsum(1))
    top = centres[:, 0] - size // 2
    left = centres[:, 1] - size // 2
    bottom, right = top + size, left + size
    total = (integral[bottom, right] - integral[top, right]
             - integral[bottom, left] + integral[top, left])
    return total / float(size * size)


def grid_centres(h: int, w: int, size: int, stride: int) -> np.ndarray:
    """Centres (K, 2) as (row, col) of a regular grid of ``size`` windows with step
    ``stride``, every window fully inside an ``h`` x ``w`` image and the margins left
    over balanced on both sides (none when the image is smaller than one window)."""
    half = size // 2
    axes = [half + (n - size) % stride // 2 + np.arange(0, max(n - size + 1, 0), stride)
            for n in (h, w)]
    rr, cc = np.meshgrid(*axes, indexing="ij")
    return np.stack([rr.ravel(), cc.ravel()], axis=1).astype(np.int64)
