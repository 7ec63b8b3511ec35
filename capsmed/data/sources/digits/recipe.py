"""``capsmed predict`` on a run of scikit-learn's digits: an image becomes what the
set's scans became, enlarged to the recorded ``box`` and centred on the black ``size``
canvas (an 8x8 scan exactly as :func:`~capsmed.data.sources.digits.reader.digit_images`
made the set); an image of the canvas's size is taken as it is."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np

from capsmed.data.sources.mnist.recipe import DigitImage

log = logging.getLogger(__name__)


class ScanImage(DigitImage):
    """A grey digit scan, light on black."""

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        scan = self.grey(path)[..., 0]
        native = (scan.shape[1], scan.shape[0])
        if scan.shape == self.shape:
            return scan[None], native
        box = int(self.record.preprocessing.get("box", 20))
        if scan.shape != (8, 8):
            log.info("%s: %dx%d, not an 8x8 scan; resized to the %d px box the set's "
                     "digits fill", path, scan.shape[1], scan.shape[0], box)
        shrink = scan.shape[0] * scan.shape[1] > box * box
        boxed = cv2.resize(scan, (box, box), interpolation=cv2.INTER_AREA if shrink
                           else cv2.INTER_LINEAR)  # the set's INTER_LINEAR for 8x8 scans
        canvas = np.zeros(self.shape, np.uint8)
        top, left = (self.shape[0] - box) // 2, (self.shape[1] - box) // 2
        canvas[top:top + box, left:left + box] = boxed
        return canvas[None], native
