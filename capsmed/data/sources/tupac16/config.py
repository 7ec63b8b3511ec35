"""The parameters of ``capsmed preprocess tupac16`` (paper 000's protocol)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from capsmed.data.normalise_options import check_stain_norm
from capsmed.data.sources.common import DEFAULT_H_MAX, check_fractions, default_fractions
from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class Tupac16Config:
    """Every parameter of TUPAC16 preprocessing; all of it is recorded in the file.

    Attributes:
        patch_size: Side of the square patch cut at source resolution (paper: 100).
        output_size: Side after INTER_AREA resizing (paper: 28).
        jitter: Maximum translation (px, each axis) of jittered positive copies (paper: 30).
        positives_per_mitosis: Patches per mitosis: one centred, the rest jittered.
        negatives_per_image: Negative patches per image; None balances the classes
            within each split.
        min_tissue: Minimum tissue fraction of a negative patch (guards background tiles).
        mitosis_radius: A negative patch keeps this margin (px) around every mitosis.
        h_max: Hematoxylin density mapped to black (fixed uint8 scaling).
        fractions: Case-level split fractions (summing to 1), used unless
            ``split_files`` is given.
        split_files: ``{split: path}`` lists of case ids, one per line.
        seed: Seed for the case split, jitter and negative sampling.
        workers: Processes for the per-image work (0 = one per CPU, up to 8).
        allow_group_leak: Write even if a case lands in two splits.
        allow_no_annotations: Write even when no ground-truth CSV holds a mitosis (a
            set of negatives only); without it that is an error naming the folder.
        stain_norm: Stain normalisation of the RGB images, first: ``none``,
            ``macenko`` or ``reinhard`` (:mod:`capsmed.data.normalise`) towards the
            target; each image gives its own statistics.
        stain_target: The target: an RGB reference image, or a JSON file of its
            statistics (a file's recorded ``stain_normalisation``).
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset((
        "negatives_per_image", "negatives_per_image_used", "positives_per_mitosis",
        "allow_no_annotations"))

    patch_size: int = 100
    output_size: int = 28
    jitter: int = 30
    positives_per_mitosis: int = 20
    negatives_per_image: int | None = None
    min_tissue: float = 0.5
    mitosis_radius: int = 15
    h_max: float = DEFAULT_H_MAX
    fractions: dict[str, float] = field(default_factory=default_fractions)
    split_files: dict[str, str] | None = None
    seed: int = 0
    workers: int = 0
    allow_group_leak: bool = False
    allow_no_annotations: bool = False
    stain_norm: str = "none"
    stain_target: str | None = None

    def __post_init__(self) -> None:
        if self.seed < 0:  # NumPy's generator failed on it with a traceback
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")
        if self.patch_size < 8 or self.output_size < 4:
            raise CapsmedError("patch_size must be >= 8 and output_size >= 4")
        if self.jitter < 0 or self.positives_per_mitosis < 1:
            raise CapsmedError("jitter must be >= 0 and positives_per_mitosis >= 1")
        if self.jitter >= self.patch_size // 2:
            raise CapsmedError(f"jitter ({self.jitter}) must be smaller than half the patch "
                               f"({self.patch_size // 2}) so every positive contains its mitosis")
        if self.negatives_per_image is not None and self.negatives_per_image < 0:
            raise CapsmedError("negatives_per_image must be >= 0")
        if self.mitosis_radius < 0:
            raise CapsmedError(f"mitosis_radius must be >= 0, got {self.mitosis_radius}")
        if not 0.0 <= self.min_tissue <= 1.0:
            raise CapsmedError("min_tissue must be within [0, 1]")
        if not 0 < self.h_max < math.inf:  # NaN made every patch NaN, inf white
            raise CapsmedError(f"h_max must be a number > 0, got {self.h_max}")
        check_fractions(self.fractions)
        check_stain_norm(self.stain_norm, self.stain_target)
