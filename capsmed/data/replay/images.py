"""Reading an input as training read its raw files, and the two kinds of recipe: windows
over an image (patch-level sources) and one prediction per image (image-level ones).

A source's ``recipe.py`` subclasses :class:`PatchRecipe` or :class:`WholeImage` with
the parameters its preprocessing recorded (:func:`recorded`).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.images import opaque, read_image, to_uint8
from capsmed.data.patches import extract_patches, grid_centres, resize_patches, window_fraction
from capsmed.data.record import DatasetRecord
from capsmed.data.replay.options import Overrides
from capsmed.data.replay.windows import (
    Prepared,
    check_centres,
    check_windows_inside,
    in_chunks,
    thumbnail,
)
from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)

TIFF_SUFFIXES = (".tif", ".tiff")


def read_8bit(path: Path) -> np.ndarray:
    """An image file as stored, 16-bit scaled to uint8 by ``v >> 8`` as the TUPAC16 and
    AML training readers scale 16-bit TIFFs (so a PNG gives the TIFF's pixels)."""
    image = read_image(path)
    return (image >> 8).astype(np.uint8) if image.dtype == np.uint16 else \
        to_uint8(image, "full", path)


def alpha_on_white(image: np.ndarray) -> np.ndarray:
    """(H, W, C) uint8 with alpha (C 2 or 4) composited over white, ``rgb*a + 255*(1-a)``
    as the AML reader blends unassociated alpha; without alpha, as it is."""
    if image.ndim != 3 or image.shape[-1] not in (2, 4):
        return image
    alpha = image[..., -1:].astype(np.float32) / 255.0
    colour = image[..., :-1].astype(np.float32) * alpha + 255.0 * (1.0 - alpha)
    return np.clip(np.rint(colour), 0, 255).astype(np.uint8)


def read_rgb(path: Path, dataset: str = "the training") -> np.ndarray:
    """Any colour image file as (H, W, 3) uint8 RGB (TIFF pixels as the TUPAC16 reader
    reads them, 16 bits scaled as it does in every format). An alpha channel is dropped
    when opaque and refused otherwise (:func:`opaque`): the photographs of ``dataset``
    have none, and the colour under a transparent pixel (often black) would be scored
    as tissue."""
    image = read_8bit(path)  # a TIFF through read_tiff, as read_rgb_tiff reads it
    if image.ndim != 3 or image.shape[-1] not in (3, 4):  # as read_rgb_tiff refuses it
        raise CapsmedError(f"{path}: expected an RGB image, got shape {image.shape}")
    return np.ascontiguousarray(opaque(path, image, dataset))


def recorded(record: DatasetRecord, key: str) -> Any:
    try:
        return record.preprocessing[key]
    except KeyError:
        raise CapsmedError(f"{record.origin}: the preprocessing record has no '{key}'; it "
                           f"was written by another capsmed version") from None


class PatchRecipe(abc.ABC):
    """Windows over one image of a patch-level source (TUPAC16, DIARETDB1); a subclass
    says which channel the model sees and which mask windows must cover."""

    windowed = True
    accepts = frozenset({"stride", "min_tissue"})

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        self.record = record
        self.size = int(recorded(record, "patch_size"))
        self.out = int(recorded(record, "output_size"))
        self.stride = overrides.stride or int(record.preprocessing.get("stride")
                                              or max(1, self.size // 2))
        self.overrides = overrides

    @abc.abstractmethod
    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:
        """The model's channel, the mask windows must cover, the share they need, notes."""

    slides = False  # whether whole slides can be read region by region (then also
    # accepts --level / --mpp)
    pads_edges = True  # a given centre's window past the edge is reflect-padded, as
    # training padded its patches (TUPAC16); False: refused, training's lay inside

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        from capsmed.data.replay.slides import SlideWindows, is_slide

        if is_slide(path):
            if not self.slides:
                raise CapsmedError(f"{path}: a whole slide, but this run (dataset "
                                   f"{self.record.dataset!r}) predicts on photographs "
                                   "(PNG, JPEG, TIFF)")
            return SlideWindows(self, self.overrides).prepare(path, centres)
        if self.overrides.level is not None or self.overrides.mpp is not None:
            raise CapsmedError(f"{path}: a plain image, read whole at its own resolution; "
                               "--level and --mpp apply to whole slides only")
        rgb = read_rgb(path, self.record.dataset)
        h, w = rgb.shape[:2]
        if h < self.size or w < self.size:
            raise CapsmedError(f"{path}: image is {w}x{h} px, smaller than one "
                               f"{self.size} px window")
        channel, mask, needed, notes = self.channel_and_mask(path, rgb)
        if centres is None:
            rc = grid_centres(h, w, self.size, self.stride)
            rc = rc[window_fraction(mask, rc, self.size) >= needed] if len(rc) else rc
        else:
            rc = check_centres(path, centres, w, h)[:, ::-1]
            if not self.pads_edges:
                check_windows_inside(path, rc, self.size, w, h)
        return Prepared(size=(w, h), footprint=float(self.size),
                        chunks=in_chunks(rc[:, ::-1].copy(), lambda xy: self.cut(channel, xy)),
                        expected=len(rc), thumbnail=thumbnail(rgb), notes=notes)

    def cut(self, channel: np.ndarray, xy: np.ndarray) -> np.ndarray:
        """The model inputs (K, 1, out, out) of windows centred on ``xy`` (x, y)."""
        patches = extract_patches(channel, xy[:, ::-1], self.size)
        return resize_patches(patches, self.out)[:, None]


class WholeImage(abc.ABC):
    """Image-level sources: one prediction per image, converted as in training; a
    subclass says how an image file becomes the model's input."""

    windowed = False
    slides = False
    accepts: frozenset[str] = frozenset()

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        self.record = record
        self.channels = record.channels
        self.shape = tuple(record.image_size)

    @abc.abstractmethod
    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        """(C, H, W) uint8 model input and the image's native (width, height)."""

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        image, (w, h) = self.convert(path)
        centre = np.array([[w // 2, h // 2]], dtype=np.int64)
        return Prepared(size=(w, h), footprint=float(max(w, h)),
                        chunks=iter([(np.ascontiguousarray(image)[None], centre)]),
                        expected=1, windowed=False)


def config_from_record(config: type, record: DatasetRecord,
                       as_applied: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                       ) -> Any:
    """``config`` (a source's options dataclass) rebuilt from the recorded parameters
    it has (JSON gives lists where a config holds tuples). ``as_applied`` maps them to
    what they did, for a file written before an option that did nothing there was
    refused (it is replayed as it was made, not refused)."""
    known = {f.name for f in fields(config)}
    given = {k: tuple(v) if isinstance(v, list) else v
             for k, v in record.preprocessing.items() if k in known}
    given = as_applied(given) if as_applied is not None else given
    try:
        return config(**given)
    except CapsmedError as exc:
        raise CapsmedError(f"{record.origin}: {exc}") from None
