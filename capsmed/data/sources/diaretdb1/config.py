"""The parameters of ``capsmed preprocess diaretdb1`` (paper 000's protocol)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

from capsmed.data.sources.common import DEFAULT_CLIP_LIMIT, DEFAULT_TILE_GRID
from capsmed.errors import CapsmedError

LESION_TYPES = ("hardexudates", "softexudates", "hemorrhages", "redsmalldots")
DEFAULT_VAL_FRACTION = 0.15


@dataclass(frozen=True)
class Diaretdb1Config:
    """Every parameter of DIARETDB1 preprocessing; all of it is recorded in the file.

    Attributes:
        patch_size: Side of the square patch cut at source resolution (paper: 200).
        output_size: Side after INTER_AREA resizing (paper: 28).
        stride: Step (px) of the grid of candidate patches.
        confidence: A ground-truth pixel is lesion when value/255 >= this (toolkit: 0.75).
        lesions: Lesion types whose thresholded maps make the lesion class.
        min_lesion_pixels: Lesion pixels a patch needs to be ``lesion``; None = the source
            pixels behind one output pixel, ceil((patch_size / output_size)^2): fewer
            cannot show as much as one pixel after resizing. Patches with some but fewer
            lesion pixels are dropped, not called healthy.
        min_fov: Minimum share of a patch inside the fundus mask.
        lesion_patches_per_component: Patches per connected lesion component: the first
            centred on it, the rest translated by up to ``jitter`` px (0 = grid only).
        jitter: Maximum translation (px, each axis) of the extra lesion-centred copies;
            None = a quarter of the patch (50 px at 200).
        balance: Subsample the larger class within each split to the smaller one's size.
        clip_limit: CLAHE clip limit (paper: 3).
        tile_grid: CLAHE tiles as (rows, cols).
        val_fraction: Share of the training images moved to validation (by image, seeded).
        split_files: ``{split: path}`` image lists replacing the official ones.
        seed: Seed for the validation images, jitter and class balancing.
        workers: Processes for the per-image work (0 = one per CPU, up to 8).
        allow_group_leak: Write even if an image lands in two splits.
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset((
        "val_fraction", "balance", "images", "candidates", "dropped_ambiguous"))

    patch_size: int = 200
    output_size: int = 28
    stride: int = 100
    confidence: float = 0.75
    lesions: tuple[str, ...] = LESION_TYPES
    min_lesion_pixels: int | None = None
    min_fov: float = 0.75
    lesion_patches_per_component: int = 1
    jitter: int | None = None
    balance: bool = True
    clip_limit: float = DEFAULT_CLIP_LIMIT
    tile_grid: tuple[int, int] = DEFAULT_TILE_GRID
    val_fraction: float = DEFAULT_VAL_FRACTION
    split_files: dict[str, str] | None = None
    seed: int = 0
    workers: int = 0
    allow_group_leak: bool = False

    def __post_init__(self) -> None:
        if self.seed < 0:  # NumPy's generator failed on it with a traceback
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")
        if self.patch_size < 8 or self.output_size < 4 or self.stride < 1:
            raise CapsmedError("patch_size must be >= 8, output_size >= 4 and stride >= 1")
        if not 0.0 < self.confidence <= 1.0:
            raise CapsmedError(f"confidence must be within (0, 1], got {self.confidence}")
        unknown = sorted(set(self.lesions) - set(LESION_TYPES))
        if unknown or not self.lesions:
            raise CapsmedError(f"lesions must be a non-empty subset of {', '.join(LESION_TYPES)}"
                               + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        if self.min_lesion_pixels is not None and self.min_lesion_pixels < 1:
            raise CapsmedError("min_lesion_pixels must be >= 1")
        if not 0.0 <= self.min_fov <= 1.0 or not 0.0 <= self.val_fraction < 1.0:
            raise CapsmedError("min_fov must be within [0, 1] and val_fraction within [0, 1)")
        if self.lesion_patches_per_component < 0 or not 0 <= self.max_jitter < self.patch_size // 2:
            raise CapsmedError(f"lesion_patches_per_component must be >= 0 and jitter within "
                               f"[0, {self.patch_size // 2}) so copies keep their lesion")
        if not 0 < self.clip_limit < math.inf or len(self.tile_grid) != 2 \
                or min(self.tile_grid) < 1:
            raise CapsmedError("clip_limit must be > 0 and tile_grid two positive integers")
        # options that would be recorded in the file but change nothing
        if self.jitter is not None and self.lesion_patches_per_component < 2:
            raise CapsmedError(f"jitter moves the extra lesion-centred copies, and with "
                               f"lesion_patches_per_component "
                               f"{self.lesion_patches_per_component} there are none; give "
                               "--lesion-patches-per-component 2 or more, or drop --jitter")
        if "val" in (self.split_files or {}) \
                and self.val_fraction != DEFAULT_VAL_FRACTION:
            raise CapsmedError("val_fraction has no effect with a val split file (the "
                               "validation images are listed); drop one of them")
        object.__setattr__(self, "lesions", tuple(t for t in LESION_TYPES if t in self.lesions))
        object.__setattr__(self, "tile_grid", tuple(int(v) for v in self.tile_grid))

    @property
    def lesion_pixels_needed(self) -> int:
        """``min_lesion_pixels``, or one output pixel's worth of source pixels."""
        if self.min_lesion_pixels is not None:
            return self.min_lesion_pixels
        return math.ceil((self.patch_size / self.output_size) ** 2 - 1e-9)

    @property
    def max_jitter(self) -> int:
        """``jitter``, or a quarter of the patch side."""
        return self.patch_size // 4 if self.jitter is None else self.jitter

    def parameters(self) -> dict:
        """Everything to record in the dataset file (all fields but ``workers``)."""
        out = {k: v for k, v in asdict(self).items() if k != "workers"}
        out["lesions"] = list(self.lesions)
        out["tile_grid"] = list(self.tile_grid)
        return out
