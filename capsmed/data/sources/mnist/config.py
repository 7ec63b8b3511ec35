"""The parameters of the digit sets: MNIST / Fashion-MNIST, MultiMNIST and affNIST."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from capsmed.errors import CapsmedError

DATASETS = ("mnist", "fashion-mnist")
PLACEMENTS = ("none", "center40", "random40")


def _check_val(val: float) -> None:
    # not finite: NaN passed both comparisons and failed in the split with a traceback
    if not 0 <= val < math.inf or (val >= 1 and val != int(val)):
        raise CapsmedError(f"val must be a count (>= 1) or a fraction in [0, 1), got {val}")


@dataclass(frozen=True)
class MnistConfig:
    """Every parameter of MNIST / Fashion-MNIST preprocessing (all recorded in the file).

    Attributes:
        dataset: ``"mnist"`` or ``"fashion-mnist"`` (sets the class names).
        val: Validation images taken from the training file: a count if >= 1, a
            fraction if < 1, 0 for none. 5,000 is the customary MNIST hold-out.
        placement: ``"none"`` (28x28 as is), ``"center40"`` (padded to 40x40) or
            ``"random40"`` (paper 004: random position on a 40x40 canvas, every split).
        seed: Seed for the validation sample and the random positions.
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset((
        "val", "val_count", "split_sources", "groups"))

    dataset: str = "mnist"
    val: float = 5000
    placement: str = "none"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise CapsmedError(f"unknown dataset {self.dataset!r} (use mnist or fashion-mnist)")
        if self.placement not in PLACEMENTS:
            raise CapsmedError(f"unknown placement {self.placement!r} (use "
                               f"{', '.join(PLACEMENTS)})")
        _check_val(self.val)
        if self.seed < 0:
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class MultiMnistConfig:
    """Every parameter of MultiMNIST generation (all recorded in the file).

    Attributes:
        pairs: Samples per training source image (Sabour et al.: 1,000).
        eval_pairs: Samples per validation/test source image (None: same as ``pairs``).
        shift: Maximum shift per axis in px; the canvas is 28 + 2 * shift (Sabour: 4).
        val: Validation images taken from the training file (count if >= 1, else a
            fraction; 0 for none).
        store_sources: Store both shifted digits (``image_a``, ``image_b``) for the
            reconstruction loss; False stores only the overlay (3x smaller files).
        seed: Seed for the validation sample, the partners and the shifts.
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset((
        "val", "pairs", "eval_pairs", "store_sources"))

    pairs: int = 1
    eval_pairs: int | None = None
    shift: int = 4
    val: float = 5000
    store_sources: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.pairs < 1 or (self.eval_pairs is not None and self.eval_pairs < 1):
            raise CapsmedError("pairs and eval_pairs must be >= 1")
        if not 0 <= self.shift <= 16:
            raise CapsmedError(f"shift must be within 0..16 px, got {self.shift}")
        _check_val(self.val)
        if self.seed < 0:
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class AffnistConfig:
    """Every parameter of affNIST preprocessing (recorded in the file).

    Attributes:
        split: Split name to store the images under (affNIST is a test set).
        max_images: Keep only the first this-many images (None: all; the full test
            set has 320,000).
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset(("split", "max_images",))

    split: str = "test"
    max_images: int | None = None

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "test"):
            raise CapsmedError(f"split must be train, val or test, got {self.split!r}")
        if self.max_images is not None and self.max_images < 1:
            raise CapsmedError(f"max_images must be >= 1, got {self.max_images}")
