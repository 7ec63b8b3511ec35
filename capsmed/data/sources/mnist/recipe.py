"""``capsmed predict`` on a run of the MNIST family (MNIST, Fashion-MNIST, affNIST): one
prediction per image, grey, resized to the run's input."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from capsmed.data.images import convert_channels, read_image, resize_image, to_uint8
from capsmed.data.replay.images import WholeImage

log = logging.getLogger(__name__)


class DigitImage(WholeImage):
    """A grey image of one digit or garment, light on black as the IDX files hold them."""

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        raw = read_image(path)
        image = convert_channels(to_uint8(raw, "full", path), 1)
        if image.mean() > 127:  # the digit sets are light strokes on black
            log.warning("%s: mostly light (mean %.0f of 255), but %s images are light "
                        "strokes on a black background; invert the image if its strokes "
                        "are dark", path, image.mean(), self.record.dataset)
        if image.shape[:2] != self.shape:
            image = resize_image(image, self.shape[0], keep_aspect=False)
        return image.transpose(2, 0, 1), (raw.shape[1], raw.shape[0])
