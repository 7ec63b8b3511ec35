"""``capsmed predict`` on an AML run: one prediction per cell image, read as training
read the dataset's TIFFs (alpha composited over white, cropped and resized)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsmed.data.images import convert_channels
from capsmed.data.replay.images import (
    TIFF_SUFFIXES,
    WholeImage,
    alpha_on_white,
    read_8bit,
    recorded,
)
from capsmed.data.sources.aml.reader import cell_image, read_rgba_as_rgb


class CellImage(WholeImage):
    """One leukocyte image, as the AML reader makes a sample of it."""

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        # every format's alpha over white, as the AML reader does for its TIFFs
        rgb = (read_rgba_as_rgb(path)[0] if path.suffix.lower() in TIFF_SUFFIXES else
               np.ascontiguousarray(convert_channels(alpha_on_white(read_8bit(path)), 3)))
        grey = bool(self.record.preprocessing.get("grey"))
        return (cell_image(rgb, int(recorded(self.record, "size")), grey),
                (rgb.shape[1], rgb.shape[0]))
