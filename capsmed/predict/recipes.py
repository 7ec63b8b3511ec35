"""The training preprocessing, replayed on new inputs from a run's record.

A recipe turns one input file into model inputs exactly as ``capsmed preprocess``
turned the training files into the dataset, calling the same functions with the
recorded parameters:

* ``tupac16``: hematoxylin channel -> windows over the tissue mask -> INTER_AREA resize;
* ``diaretdb1``: CLAHE green over the field of view -> windows inside it -> resize;
* ``wsi``: the slide's tissue mask -> the tile grid at the recorded level/mpp ->
  ``read_region`` -> resize -> RGB or hematoxylin;
* image-level sources (``aml``, folders, the MNIST family): one prediction per image.

Windows are centred on a regular grid (``--stride``) or on given centres. Window
centres are (x, y) in the input's level-0 pixels.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from capsmed.data.images import convert_channels, read_image, resize_image, to_uint8
from capsmed.data.patches import extract_patches, grid_centres, resize_patches, window_fraction
from capsmed.data.record import DatasetRecord
from capsmed.data.stains import hematoxylin_channel, tissue_mask
from capsmed.errors import CapsmedError
from capsmed.predict.config import Overrides
from capsmed.predict.windows import Prepared, check_centres, in_chunks, thumbnail

log = logging.getLogger(__name__)

TIFF_SUFFIXES = (".tif", ".tiff")
DIGIT_SETS = ("mnist", "fashion-mnist", "affnist")


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


def read_rgb(path: Path) -> np.ndarray:
    """Any colour image file as (H, W, 3) uint8 RGB (TIFF as the TUPAC16 reader reads it;
    other formats with 16 bits scaled as it does)."""
    if path.suffix.lower() in TIFF_SUFFIXES:
        from capsmed.data.sources.tupac16.reader import read_rgb_tiff

        return read_rgb_tiff(path)
    return np.ascontiguousarray(convert_channels(read_8bit(path), 3))


def _param(record: DatasetRecord, key: str) -> Any:
    try:
        return record.preprocessing[key]
    except KeyError:
        raise CapsmedError(f"{record.origin}: the preprocessing record has no '{key}'; it "
                           f"was written by another capsmed version") from None


class PatchRecipe(abc.ABC):
    """Windows over one image of a patch-level source (TUPAC16, DIARETDB1); a subclass
    says which channel the model sees and which mask windows must cover."""

    windowed = True

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        self.record = record
        self.size = int(_param(record, "patch_size"))
        self.out = int(_param(record, "output_size"))
        self.stride = overrides.stride or int(record.preprocessing.get("stride")
                                              or max(1, self.size // 2))
        self.overrides = overrides

    @abc.abstractmethod
    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:
        """The model's channel, the mask windows must cover, the share they need, notes."""

    slides = False  # whether whole slides can be read region by region

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        from capsmed.predict.slides import SlideWindows, is_slide

        if is_slide(path):
            if not self.slides:
                raise CapsmedError(f"{path}: a whole slide, but a {self.record.dataset} run "
                                   "predicts on photographs (PNG, JPEG, TIFF)")
            return SlideWindows(self, self.overrides).prepare(path, centres)
        if self.overrides.level is not None or self.overrides.mpp is not None:
            raise CapsmedError(f"{path}: a plain image, read whole at its own resolution; "
                               "--level and --mpp apply to whole slides only")
        rgb = read_rgb(path)
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
        return Prepared(size=(w, h), footprint=float(self.size),
                        chunks=in_chunks(rc[:, ::-1].copy(), lambda xy: self.cut(channel, xy)),
                        expected=len(rc), thumbnail=thumbnail(rgb), notes=notes)

    def cut(self, channel: np.ndarray, xy: np.ndarray) -> np.ndarray:
        """The model inputs (K, 1, out, out) of windows centred on ``xy`` (x, y)."""
        patches = extract_patches(channel, xy[:, ::-1], self.size)
        return resize_patches(patches, self.out)[:, None]


class HematoxylinPatches(PatchRecipe):
    """TUPAC16: the hematoxylin channel, windows with enough tissue."""

    slides = True

    def min_share(self) -> float:
        """The tissue share a window needs (``--min-tissue``, else as recorded)."""
        needed = self.overrides.min_tissue
        return float(_param(self.record, "min_tissue") if needed is None else needed)

    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:
        return (hematoxylin_channel(rgb, float(_param(self.record, "h_max"))),
                tissue_mask(rgb), self.min_share(), {})


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

    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:
        from capsmed.data.sources.diaretdb1.layout import read_fundus_mask
        from capsmed.data.sources.diaretdb1.reader import enhance_fundus

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
        green = enhance_fundus(rgb, mask, box, float(_param(self.record, "clip_limit")),
                               tuple(_param(self.record, "tile_grid")))
        needed = self.overrides.min_tissue
        needed = float(_param(self.record, "min_fov") if needed is None else needed)
        notes = {"fov_mask": str(given) if given else
                 "estimated: largest region brighter than 20, holes filled"}
        return green, mask, needed, notes


class WholeImage:
    """Image-level sources: one prediction per image, converted as in training."""

    windowed = False
    slides = False

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        self.record = record
        self.channels = record.channels
        self.shape = tuple(record.image_size)

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        """(C, H, W) uint8 model input and the image's native (width, height)."""
        kind, p = self.record.dataset, self.record.preprocessing
        if kind == "aml":
            from capsmed.data.sources.aml.reader import cell_image, read_rgba_as_rgb

            # every format's alpha over white, as the AML reader does for its TIFFs
            rgb = (read_rgba_as_rgb(path)[0] if path.suffix.lower() in TIFF_SUFFIXES else
                   np.ascontiguousarray(convert_channels(alpha_on_white(read_8bit(path)), 3)))
            return cell_image(rgb, int(_param(self.record, "size")),
                              bool(p.get("grey"))), (rgb.shape[1], rgb.shape[0])
        if kind in DIGIT_SETS:
            raw = read_image(path)
            image = convert_channels(to_uint8(raw, "full", path), 1)
            if image.mean() > 127:  # the digit sets are light strokes on black
                log.warning("%s: mostly light (mean %.0f of 255), but %s digits are light "
                            "strokes on a black background; invert the image if its "
                            "strokes are dark", path, image.mean(), kind)
            if image.shape[:2] != self.shape:
                image = resize_image(image, self.shape[0], keep_aspect=False)
            return image.transpose(2, 0, 1), (raw.shape[1], raw.shape[0])
        from capsmed.data.sources.folder.config import FolderConfig
        from capsmed.data.sources.folder.reader import load_image

        known = {f.name for f in fields(FolderConfig)}
        cfg = FolderConfig(**{k: _listless(v) for k, v in p.items() if k in known})
        image, native, _, _ = load_image(path, self.channels, cfg)
        if image.shape[1:] != self.shape:
            raise CapsmedError(f"{path}: image is {native[1]}x{native[0]}, but the run was "
                               f"trained on {self.shape[1]}x{self.shape[0]} images stored "
                               "unresized")
        return image, (native[1], native[0])

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        image, (w, h) = self.convert(path)
        centre = np.array([[w // 2, h // 2]], dtype=np.int64)
        return Prepared(size=(w, h), footprint=float(max(w, h)),
                        chunks=iter([(np.ascontiguousarray(image)[None], centre)]),
                        expected=1, windowed=False)


def _listless(value: Any) -> Any:
    """JSON gives lists where a config holds tuples."""
    return tuple(value) if isinstance(value, list) else value


def make_recipe(record: DatasetRecord, overrides: Overrides) -> Any:
    """The recipe that replays ``record``'s preprocessing, or a refusal naming why."""
    if overrides.stride is not None and overrides.stride < 1:
        raise CapsmedError(f"--stride must be >= 1, got {overrides.stride}")
    if overrides.min_tissue is not None and not 0.0 <= overrides.min_tissue <= 1.0:
        raise CapsmedError(f"--min-tissue must be within [0, 1], got {overrides.min_tissue}")
    kind, p = record.dataset, record.preprocessing
    if overrides.fov_mask is not None and kind != "diaretdb1":
        raise CapsmedError(f"--fov-mask applies to diaretdb1 runs, not {kind}")
    for name, value in (("--level", overrides.level), ("--mpp", overrides.mpp)):
        if value is not None and kind not in ("tupac16", "wsi"):
            raise CapsmedError(f"{name} applies to runs that read whole slides (tupac16, "
                               f"wsi), not {kind}")
    if kind == "tupac16":
        return HematoxylinPatches(record, overrides)
    if kind == "diaretdb1":
        return FundusPatches(record, overrides)
    if kind == "wsi":
        from capsmed.predict.slides import SlideTiles

        return SlideTiles(record, overrides)
    if kind == "multimnist":
        raise CapsmedError("a multimnist run names two overlapping digits per image; "
                           "predict handles single-label runs")
    if kind in ("aml", *DIGIT_SETS) or "scale16" in p:
        return WholeImage(record, overrides)
    raise CapsmedError(f"{record.origin}: predict does not know how the '{kind}' dataset "
                       "was preprocessed")
