"""The looked-up stain densities and tissue mask are bit-identical to scikit-image's
rgb2hed and to the per-pixel logarithm they replace, on real images shipped with
scikit-image and on every 8-bit colour value's corners."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data
from skimage.color import rgb2hed

from capsmed.data.stains import hematoxylin_channel, hematoxylin_density, tissue_mask


def _images() -> list[np.ndarray]:
    grid = np.stack(np.meshgrid(*[np.arange(0, 256, 15, dtype=np.uint8)] * 3), -1)
    return [data.immunohistochemistry(), data.retina()[..., :3],
            grid.reshape(-1, 18 * 18, 3)]  # every 15th value of each channel, combined


@pytest.mark.parametrize("image", _images(), ids=["ihc", "retina", "value-grid"])
def test_lookups_equal_rgb2hed_and_the_logarithm(image):
    assert np.array_equal(hematoxylin_density(image),
                          np.clip(rgb2hed(image)[..., 0], 0.0, None).astype(np.float32))
    h = np.clip(rgb2hed(image)[..., 0], 0.0, None).astype(np.float32)
    assert np.array_equal(hematoxylin_channel(image, 0.2),
                          np.round(255.0 * (1.0 - np.clip(h / 0.2, 0.0, 1.0))).astype(np.uint8))
    od = -np.log((image.astype(np.float32) + 1.0) / 256.0).mean(axis=-1)
    assert np.array_equal(tissue_mask(image), cv2.blur(od, (15, 15)) > 0.15)
    assert np.array_equal(tissue_mask(image, smooth=1), od > 0.15)


def test_grey_or_non_8_bit_images_are_refused_not_read_as_columns():
    grey = np.full((50, 60), 120, np.uint8)  # [..., :3] would take its first 3 columns
    for bad in (grey, np.zeros((8, 8, 3), np.uint16), np.zeros((8, 8, 3))):
        for call in (hematoxylin_density, hematoxylin_channel, tissue_mask):
            with pytest.raises(ValueError, match=r"needs an \(H, W, 3\) uint8 RGB"):
                call(bad)
