"""``capsmed predict`` on a toy run: one prediction per image, loaded as in training."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsmed.data.replay.images import WholeImage, recorded
from tests.toy_source.reader import load


class ToyImage(WholeImage):
    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        return load(path, int(recorded(self.record, "size"))), (32, 32)
