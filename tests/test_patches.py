"""Patch cutting and tissue fractions, against the plainest slicing of the same pixels."""

from __future__ import annotations

import numpy as np
import pytest

from capsmed.data.patches import extract_patches, window_fraction


def _one_by_one(image, centres, size):
    """Each patch sliced from the reflect-padded image in a Python loop."""
    half = size // 2
    pad = [(half + 1, half + 1)] * 2 + [(0, 0)] * (image.ndim - 2)
    padded = np.pad(image, pad, mode="reflect")
    return np.stack([padded[r + 1:r + 1 + size, c + 1:c + 1 + size] for r, c in centres])


@pytest.mark.parametrize("channels", [None, 3])
@pytest.mark.parametrize("size", [1, 8, 9])
def test_patches_inside_and_across_the_border_equal_slices(channels, size):
    rng = np.random.default_rng(size)
    shape = (23, 31) if channels is None else (23, 31, channels)
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    inside = np.array([[size // 2 + 2, size // 2 + 3], [15, 20]])
    border = np.array([[0, 0], [22, 30], [0, 30], [11, 1]])
    for centres in (inside, np.concatenate([inside, border])):
        patches = extract_patches(image, centres, size)
        assert patches.shape == (len(centres), size, size, *shape[2:])
        assert patches.flags.c_contiguous
        np.testing.assert_array_equal(patches, _one_by_one(image, centres, size))
    # the centre pixel of an odd or even patch is the point itself
    assert (extract_patches(image, border, size)[:, size // 2, size // 2]
            == image[border[:, 0], border[:, 1]]).all()


def test_patch_centres_outside_the_image_are_refused():
    with pytest.raises(ValueError, match="inside the 4x5 image"):
        extract_patches(np.zeros((4, 5), np.uint8), [[4, 0]], 3)


def test_window_fraction_counts_the_window_pixels():
    rng = np.random.default_rng(0)
    mask = rng.random((40, 50)) > 0.6
    centres = np.array([[5, 5], [20, 25], [34, 44], [10, 40]])
    for size in (10, 11):
        half = size // 2
        expected = [mask[r - half:r - half + size, c - half:c - half + size].mean()
                    for r, c in centres]
        np.testing.assert_array_equal(window_fraction(mask, centres, size), expected)
