"""The toy source's options."""

from __future__ import annotations

from dataclasses import dataclass

from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class ToyConfig:
    """Attributes:
        size: Side the images are resized to.
        seed: Seed of the patient split.
    """

    size: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.size < 8:
            raise CapsmedError(f"size must be >= 8, got {self.size}")
