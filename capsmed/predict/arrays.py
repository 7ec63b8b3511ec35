"""``capsmed.predict_array``: a run applied to images held in memory, as ``capsmed
predict`` applies it to image files.

Each array goes through the same recipe as a file would (:mod:`capsmed.data.replay`):
the training preprocessing replayed, windows over it for patch-level runs (TUPAC16,
DIARETDB1), one prediction for image-level ones. The recipes read files, so each array
is written losslessly to a temporary TIFF first (its exact pixels, dtype and channels):
what it gives is what ``capsmed predict`` gives on that image saved as a lossless file.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.replay import make_recipe
from capsmed.data.replay.options import Overrides
from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class ArrayPrediction:
    """One image's prediction.

    Attributes:
        scores: float64 [M, K] class scores (softmax probabilities for ConvNets,
            capsule lengths for capsule networks): one row per window of a patch-level
            run, one row for an image-level run.
        centres: int64 [M, 2] window centres as (x, y) in the image's pixels; the
            image's centre for an image-level run.
        class_names: The K classes, in the order of ``scores``' columns.
        windowed: Whether the rows are windows (patch-level run).
    """

    scores: np.ndarray
    centres: np.ndarray
    class_names: tuple[str, ...]
    windowed: bool


def as_images(images: Any) -> list[np.ndarray]:
    """One image (H, W) or (H, W, C), a stack [N, H, W, C], or a sequence of images ->
    a list of (H, W[, C]) arrays, each checked."""
    if isinstance(images, np.ndarray):
        listed = list(images) if images.ndim == 4 else [images]
    elif isinstance(images, Sequence) and not isinstance(images, (str, bytes)):
        listed = [np.asarray(image) for image in images]
    else:
        raise CapsmedError(f"images: expected a NumPy array or a list of them, got "
                           f"{type(images).__name__}")
    if not listed:
        raise CapsmedError("images: no image given")
    for i, image in enumerate(listed):
        _check(i, image)
    return [image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image
            for image in listed]


def _check(i: int, image: np.ndarray) -> None:
    if image.dtype not in (np.uint8, np.uint16):
        raise CapsmedError(f"images[{i}]: {image.dtype} pixels; give uint8 (or uint16) "
                           "values as an image file holds them, not scaled floats")
    shape_ok = image.ndim == 2 or (image.ndim == 3 and image.shape[-1] in (1, 2, 3, 4))
    if not shape_ok or min(image.shape[:2]) < 1:
        raise CapsmedError(f"images[{i}]: shape {list(image.shape)}; expected (H, W) "
                           "grey or (H, W, C) with C 1, 2 (grey+alpha), 3 (RGB) or "
                           "4 (RGBA), or a stack [N, H, W, C]")


def predict_array(run: Any, images: Any, stride: int | None = None,
                  min_tissue: float | None = None, fov_mask: Path | str | None = None,
                  batch_size: int = 512) -> list[ArrayPrediction]:
    """Class scores of raw in-memory images, the run's preprocessing replayed.

    Args:
        run: A run folder, or a run from :func:`capsmed.load_run` (not opened again).
        images: One image as a file holds it, (H, W) grey or (H, W, C) RGB(A) in RGB
            order, uint8 (or uint16, scaled as the run's reader scales 16-bit files);
            a stack [N, H, W, C]; or a list of images of any sizes.
        stride, min_tissue, fov_mask: As ``capsmed predict``'s options (patch-level
            runs; None: as recorded in training).
        batch_size: Windows scored at a time.

    Returns:
        One :class:`ArrayPrediction` per image, in order.

    Raises:
        CapsmedError: an image the run cannot take (its dtype, shape, size or colour),
            named by its index (``images[3]``), or an option this kind of run ignores.
    """
    from capsmed.runs import OpenRun, open_run

    if isinstance(run, OpenRun):  # load_run warned of an unfinished run
        opened = run
    else:
        opened = open_run(Path(run), device="cpu", need_data=False)
        opened.warn_if_unfinished("predicts with", "predict")  # as capsmed predict warns
    arrays = as_images(images)
    recipe = make_recipe(opened.record(), Overrides(
        stride=stride, min_tissue=min_tissue,
        fov_mask=Path(fov_mask) if fov_mask is not None else None))
    with tempfile.TemporaryDirectory(prefix="capsmed-array-") as tmp:
        return [_one(opened, recipe, i, image, Path(tmp) / f"image-{i}.tif", batch_size)
                for i, image in enumerate(arrays)]


def _one(run: Any, recipe: Any, i: int, image: np.ndarray, path: Path,
         batch_size: int) -> ArrayPrediction:
    import tifffile

    channels = image.shape[-1] if image.ndim == 3 else 1
    alpha = ["unassalpha"] if channels in (2, 4) else None  # grey+alpha, RGBA
    tifffile.imwrite(path, np.ascontiguousarray(image), extrasamples=alpha,
                     photometric="rgb" if channels >= 3 else "minisblack")
    try:
        prepared = recipe.prepare(path, None)
        chunks = [(run.predict(inputs, batch_size), centres)
                  for inputs, centres in prepared.chunks]
    except CapsmedError as exc:
        raise CapsmedError(str(exc).replace(str(path), f"images[{i}]")) from None
    finally:
        path.unlink(missing_ok=True)
    k = len(run.class_names)
    scores = np.concatenate([s for s, _ in chunks]) if chunks else np.empty((0, k))
    centres = (np.concatenate([c for _, c in chunks]) if chunks
               else np.empty((0, 2), np.int64))
    return ArrayPrediction(scores=scores, centres=centres.astype(np.int64),
                           class_names=run.class_names, windowed=prepared.windowed)
