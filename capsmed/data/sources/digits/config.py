"""The parameters of ``capsmed preprocess digits`` (scikit-learn's digit scans)."""

from __future__ import annotations

from dataclasses import dataclass, field

from capsmed.data.sources.common import check_fractions
from capsmed.errors import CapsmedError


def _fractions() -> dict[str, float]:
    return {"train": 0.6, "val": 0.1, "test": 0.3}


@dataclass(frozen=True)
class DigitsConfig:
    """Every parameter of the digits set; all of it is recorded in the file.

    Attributes:
        size: Output side. The 8x8 scan is enlarged to a ``box`` px square (bilinear,
            OpenCV INTER_LINEAR) and centred on a black ``size`` canvas, as MNIST
            centres its 20x20 digits in 28x28.
        box: Side of the enlarged digit (MNIST: 20).
        fractions: Share of the images per split, per class (stratified). The set
            records no writer, so images of one writer may fall in two splits.
        seed: Seed of the split.
    """

    size: int = 28
    box: int = 20
    fractions: dict[str, float] = field(default_factory=_fractions)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 8 <= self.box <= self.size <= 256:
            raise CapsmedError(f"need 8 <= box <= size <= 256, got box {self.box}, size "
                               f"{self.size}")
        check_fractions(self.fractions)
        if self.seed < 0:
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")
