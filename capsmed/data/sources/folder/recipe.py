"""``capsmed predict`` on a class-folder run: one prediction per image, loaded with the
recorded channels, 16-bit scaling, stain normalisation and size as ``capsmed preprocess
folder`` loaded it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsmed.data.normalise import recorded_normaliser
from capsmed.data.replay.images import WholeImage, config_from_record
from capsmed.data.sources.folder.config import FolderConfig, as_applied
from capsmed.data.sources.folder.reader import load_image
from capsmed.errors import CapsmedError


class FolderImage(WholeImage):
    """One image file of a class-folder set."""

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        cfg = config_from_record(FolderConfig, self.record, as_applied)
        stain = recorded_normaliser(self.record.preprocessing, self.record.origin)
        image, native, _, _ = load_image(path, self.channels, cfg, stain)
        if image.shape[1:] != self.shape:
            raise CapsmedError(f"{path}: image is {native[1]}x{native[0]}, but the run was "
                               f"trained on {self.shape[1]}x{self.shape[0]} images stored "
                               "unresized")
        return image, (native[1], native[0])
