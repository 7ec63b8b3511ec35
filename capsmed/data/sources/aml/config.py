"""The parameters of ``capsmed preprocess aml`` (paper 001's protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from capsmed.errors import CapsmedError

LABEL_MODES = ("original", "agreed")


@dataclass(frozen=True)
class AmlConfig:
    """Every parameter of AML preprocessing (all but ``workers``/``chunk_size`` recorded).

    Attributes:
        size: Output side after INTER_AREA resizing (28 for the 28x28 studies).
        grey: Store one luma channel (ITU-R 601) instead of RGB.
        labels: ``original`` keeps every image with its original label; ``agreed``
            drops images whose re-annotations disagree with it or are UNC.
        folds: Number of stratified cross-validation folds (paper 001: 5).
        seed: Seed of the fold assignment.
        workers: Worker processes (0 = one per CPU, up to 8); output does not depend on it.
        chunk_size: Images per worker job; output does not depend on it.
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset(("folds", "chunk_size",))

    size: int = 28
    grey: bool = False
    labels: str = "original"
    folds: int = 5
    seed: int = 0
    workers: int = 0
    chunk_size: int = 128

    def __post_init__(self) -> None:
        if self.seed < 0:  # NumPy's generator failed on it with a traceback
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")
        if self.size < 4:
            raise CapsmedError(f"size must be >= 4, got {self.size}")
        if self.labels not in LABEL_MODES:
            raise CapsmedError(f"labels must be one of {', '.join(LABEL_MODES)}, "
                               f"got {self.labels!r}")
        if not 2 <= self.folds <= 127:
            raise CapsmedError(f"folds must be within 2..127, got {self.folds}")
        if self.chunk_size < 1:
            raise CapsmedError(f"chunk_size must be >= 1, got {self.chunk_size}")
