"""What several source configs share: split fractions and stain/CLAHE defaults."""

from __future__ import annotations

from collections.abc import Mapping

from capsmed.errors import CapsmedError

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = {"train": 0.7, "val": 0.15, "test": 0.15}
# rgb2hed returns optical density / ln(1e6); dense nuclear chromatin sits around 0.07-0.14
# and uint8 input cannot exceed ~0.48, so 0.2 keeps mitoses inside the range unclipped.
DEFAULT_H_MAX = 0.2
DEFAULT_CLIP_LIMIT = 3.0  # CLAHE, paper 000 (and its public code)
DEFAULT_TILE_GRID = (8, 8)  # OpenCV's default CLAHE tile grid (rows, cols)


def default_fractions() -> dict[str, float]:
    """A fresh copy of the default train/val/test fractions (a dataclass default factory)."""
    return dict(DEFAULT_FRACTIONS)


def check_fractions(fractions: Mapping[str, float]) -> None:
    """The one check of split fractions, for every source: known splits, each within
    [0, 1], at least one positive, and a sum of 1.

    A sum other than 1 used to be rescaled silently; ``--train 0.9 --val 0.9 --test 0.1``
    is far more likely a typo than a wish for 47/47/5 %.

    Raises:
        CapsmedError: naming the fractions given.
    """
    shown = ", ".join(f"{k}={v:g}" for k, v in fractions.items())
    unknown = sorted(set(fractions) - set(SPLITS))
    if unknown:
        raise CapsmedError(f"split fractions: unknown split(s) {', '.join(unknown)} "
                           f"(use {', '.join(SPLITS)})")
    if any(not 0.0 <= v <= 1.0 for v in fractions.values()):
        raise CapsmedError(f"split fractions must be within [0, 1], got {shown}")
    total = sum(fractions.values())
    if abs(total - 1.0) > 1e-6:
        raise CapsmedError(f"split fractions ({shown}) must sum to 1, not {total:g} (give "
                           "all three, e.g. --train 0.8 --val 0.2 --test 0)")
