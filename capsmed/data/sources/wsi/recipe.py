"""``capsmed predict`` on a slide-set run: the tile grid of ``capsmed preprocess wsi``,
replayed.

The slide is opened by the same reader factory, its tissue mask made from a thumbnail
with the recorded parameters, the grid laid at the recorded level or mpp (``--level``
/ ``--mpp`` override it) and every tissue tile read, resized, stain-normalised and
stained exactly as the training tiles were. Tiles are read chunk by chunk, so a slide
never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from capsmed.data.normalise import recorded_normaliser
from capsmed.data.record import DatasetRecord
from capsmed.data.replay.images import config_from_record
from capsmed.data.replay.options import Overrides
from capsmed.data.replay.slides import scale_note
from capsmed.data.replay.windows import CHUNK, THUMBNAIL_SIDE, Prepared, check_centres
from capsmed.data.slides import Resolution, describe_slide, open_slide, tissue_fractions
from capsmed.data.sources.wsi.config import WsiConfig, as_applied
from capsmed.data.sources.wsi.reader import (
    choose_resolution,
    grid_edges,
    read_tiles,
    slide_mask,
)
from capsmed.errors import CapsmedError


def wsi_config(record: DatasetRecord, overrides: Overrides) -> WsiConfig:
    """The recorded tiling parameters, with the user's overrides."""
    cfg = config_from_record(WsiConfig, record, as_applied)
    try:
        if overrides.level is not None or overrides.mpp is not None:
            cfg = replace(cfg, level=overrides.level, mpp=overrides.mpp)
        if overrides.stride is not None:
            cfg = replace(cfg, stride=overrides.stride)
        if overrides.min_tissue is not None:
            cfg = replace(cfg, min_tissue=overrides.min_tissue)
    except CapsmedError as exc:
        raise CapsmedError(f"{record.origin}: {exc}") from None
    return cfg


class SlideTiles:
    """Tiles of a whole slide (or of a plain image opened as one), as in training."""

    windowed = True
    slides = True
    accepts = frozenset({"stride", "min_tissue", "level", "mpp"})

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        self.cfg = wsi_config(record, overrides)
        self.stain = recorded_normaliser(record.preprocessing, record.origin)
        self.trained_mpp = training_mpp(record)

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        cfg = self.cfg
        info = describe_slide(path)
        res = choose_resolution(info, cfg)
        footprint = res.footprint(cfg.tile_size)
        mask, threshold = slide_mask(info, cfg)
        if centres is None:
            xs = grid_edges(info.dimensions[0], res, cfg)
            ys = grid_edges(info.dimensions[1], res, cfg)
            frac = tissue_fractions(mask, info.dimensions, xs, ys, footprint)
            rows, cols = np.nonzero(frac >= cfg.min_tissue)  # top to bottom, left to right
            lefts = np.stack([xs[cols], ys[rows]], axis=1).astype(np.int64).reshape(-1, 2)
        else:
            xy = check_centres(path, centres, *info.dimensions, what="slide")
            lefts = xy - centre_offset(footprint)
            _check_tiles_inside(path, xy, lefts, footprint, info.dimensions)
        w0, h0 = info.dimensions
        scale = min(1.0, THUMBNAIL_SIDE / max(w0, h0))
        with open_slide(path) as slide:
            picture = np.asarray(slide.get_thumbnail(
                (max(1, round(w0 * scale)), max(1, round(h0 * scale)))).convert("RGB"))
        notes = {"level": res.level, "downsample": res.downsample, "mpp": res.mpp,
                 "read_size": res.read_size, "tile_size": cfg.tile_size,
                 "stride": cfg.step, "min_tissue": cfg.min_tissue,
                 "mask_threshold": threshold, "tissue_share": float(mask.mean()),
                 "training_mpp": self.trained_mpp,
                 **scale_note(path, res.mpp, self.trained_mpp, "the run's training tiles")}
        return Prepared(size=(w0, h0), footprint=footprint,
                        chunks=self._tiles(path, lefts, res, footprint),
                        expected=len(lefts), thumbnail=picture, notes=notes)

    def _tiles(self, path: Path, lefts: np.ndarray, res: Resolution, footprint: float
               ) -> Iterator[tuple[np.ndarray, np.ndarray]]:

        with open_slide(path) as slide:
            for start in range(0, len(lefts), CHUNK):
                part = lefts[start:start + CHUNK]
                yield (read_tiles(slide, path, part, res, self.cfg, self.stain),
                       part + centre_offset(footprint))


def centre_offset(footprint: float) -> int:
    """Level-0 px from a tile's left (top) edge to the centre written for it:
    ``footprint / 2`` rounded, a half down (an odd 33 px tile: 16, its pixel
    ``size // 2``, as a patch's centre). One whole offset both ways, so a written
    centre given back (``--centres``) reads the same tile: rounding ``left + 16.5``
    half to even moved odd lefts' centres up and even ones' down, and gave centres
    back read tiles 1 px off, two given centres 1 px apart one tile."""
    return int(np.ceil(footprint / 2 - 0.5))


def training_mpp(record: DatasetRecord) -> float | None:
    """The microns per pixel a ``wsi`` run's tiles were read at (the median over its
    slides, from the record's ``per_slide``), or None where unrecorded."""
    per_slide = record.preprocessing.get("per_slide") or {}
    known = [s["mpp"] for s in per_slide.values() if isinstance(s, dict) and s.get("mpp")]
    return float(np.median(known)) if known else None


def _check_tiles_inside(path: Path, xy: np.ndarray, lefts: np.ndarray, footprint: float,
                        size: tuple[int, int]) -> None:
    """Refuse a centre whose tile reaches past the slide: read there, the missing part is
    white padding, a tile unlike any the run trained on (its tiles lie inside)."""
    side = int(round(footprint))
    outside = (lefts < 0).any(axis=1) | (lefts[:, 0] + side > size[0]) \
        | (lefts[:, 1] + side > size[1])
    if outside.any():
        x, y = xy[np.argmax(outside)].tolist()
        raise CapsmedError(f"{path}: the {side} px tile centred on x={x}, y={y} reaches "
                           f"past the {size[0]}x{size[1]} slide; give centres at least "
                           f"{side // 2} px inside its edges")
