"""``capsmed predict`` on a TUPAC16 run: the hematoxylin channel of each image (or of a
whole slide, region by region), windows with enough tissue, resized as the patches.
A recorded stain normalisation is applied first, to each image as training applied it
to each image (on a slide: to each region read, about 2,000 px square, the size of a
TUPAC16 image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from capsmed.data.normalise import recorded_normaliser
from capsmed.data.record import DatasetRecord
from capsmed.data.replay.images import PatchRecipe, recorded
from capsmed.data.replay.options import Overrides
from capsmed.data.stains import hematoxylin_channel, tissue_mask


class HematoxylinPatches(PatchRecipe):
    """TUPAC16: the hematoxylin channel, windows with enough tissue."""

    slides = True
    accepts = PatchRecipe.accepts | {"level", "mpp"}

    def __init__(self, record: DatasetRecord, overrides: Overrides) -> None:
        super().__init__(record, overrides)
        # the recorded normalisation, applied to each image (or slide region) as read
        self.stain = recorded_normaliser(record.preprocessing, record.origin)

    def min_share(self) -> float:
        """The tissue share a window needs (``--min-tissue``, else as recorded)."""
        needed = self.overrides.min_tissue
        return float(recorded(self.record, "min_tissue") if needed is None else needed)

    def channel_and_mask(self, path: Path, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float, dict[str, Any]]:
        if self.stain is not None:
            rgb = self.stain.apply(rgb)
        return (hematoxylin_channel(rgb, float(recorded(self.record, "h_max"))),
                tissue_mask(rgb), self.min_share(), {})
