"""Whole-slide prediction: the tile grid of ``capsmed preprocess wsi``, replayed.

The slide is opened by the same reader factory, its tissue mask made from a thumbnail
with the recorded parameters, the grid laid at the recorded level or mpp (``--level``
/ ``--mpp`` override it) and every tissue tile read, resized and stained exactly as the
training tiles were. Tiles are read chunk by chunk, so a slide never sits in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from capsmed.data.configs.wsi import WsiConfig
from capsmed.data.record import DatasetRecord
from capsmed.data.slides import (
    Resolution,
    describe_slide,
    open_slide,
    read_tile,
    tissue_fractions,
)
from capsmed.data.sources.wsi import choose_resolution, grid_edges, slide_mask
from capsmed.data.stains import hematoxylin_channel
from capsmed.errors import CapsmedError
from capsmed.predict.config import Overrides
from capsmed.predict.windows import CHUNK, THUMBNAIL_SIDE, Prepared


def wsi_config(record: DatasetRecord, overrides: Overrides) -> WsiConfig:
    """The recorded tiling parameters, with the user's overrides."""
    known = {f.name for f in fields(WsiConfig)}
    given = {k: tuple(v) if isinstance(v, list) else v
             for k, v in record.preprocessing.items() if k in known}
    try:
        cfg = WsiConfig(**given)
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

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        if overrides.fov_mask is not None:
            raise CapsmedError("--fov-mask applies to diaretdb1 runs, not wsi")
        self.cfg = wsi_config(record, overrides)
        self.given_stride = overrides.stride is not None

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
            lefts = np.round(np.asarray(centres, np.float64) - footprint / 2).astype(np.int64)
        w0, h0 = info.dimensions
        scale = min(1.0, THUMBNAIL_SIDE / max(w0, h0))
        with open_slide(path) as slide:
            picture = np.asarray(slide.get_thumbnail(
                (max(1, round(w0 * scale)), max(1, round(h0 * scale)))).convert("RGB"))
        notes = {"level": res.level, "downsample": res.downsample, "mpp": res.mpp,
                 "read_size": res.read_size, "tile_size": cfg.tile_size,
                 "stride": cfg.step, "min_tissue": cfg.min_tissue,
                 "mask_threshold": threshold, "tissue_share": float(mask.mean())}
        return Prepared(size=(w0, h0), footprint=footprint,
                        centres=np.round(lefts + footprint / 2).astype(np.int64),
                        chunks=self._tiles(path, lefts, res), thumbnail=picture, notes=notes)

    def _tiles(self, path: Path, lefts: np.ndarray, res: Resolution) -> Iterator[np.ndarray]:
        import openslide

        cfg = self.cfg
        with open_slide(path) as slide:
            for start in range(0, len(lefts), CHUNK):
                tiles = []
                for x, y in lefts[start:start + CHUNK].tolist():
                    try:
                        rgb = read_tile(slide, x, y, res, cfg.out_size)
                    except (openslide.OpenSlideError, OSError, ValueError) as exc:
                        raise CapsmedError(f"{path}: cannot read the tile at x={x}, y={y} "
                                           f"({type(exc).__name__}: {exc})") from None
                    tiles.append(hematoxylin_channel(rgb, cfg.h_max)[None]
                                 if cfg.stain == "hematoxylin" else rgb.transpose(2, 0, 1))
                yield np.ascontiguousarray(np.stack(tiles))
