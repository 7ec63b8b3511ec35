"""``capsmed predict`` on a TUPAC16 run: the hematoxylin channel of each image (or of a
whole slide, region by region), windows with enough tissue, resized as the patches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.replay.images import PatchRecipe, recorded
from capsmed.data.stains import hematoxylin_channel, tissue_mask


class HematoxylinPatches(PatchRecipe):
    """TUPAC16: the hematoxylin channel, windows with enough tissue."""

    slides = True
    accepts = PatchRecipe.accepts | {"level", "mpp"}

    def min_share(self) -> float:
        """The tissue share a window needs (``--min-tissue``, else as recorded)."""
        needed = self.overrides.min_tissue
        return float(recorded(self.record, "min_tissue") if needed is None else needed)

    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:
        return (hematoxylin_channel(rgb, float(recorded(self.record, "h_max"))),
                tissue_mask(rgb), self.min_share(), {})
