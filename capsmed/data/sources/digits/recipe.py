"""``capsmed predict`` on a run of scikit-learn's digits: an image becomes what the
set's scans became, enlarged to the recorded ``box`` and centred on the black ``size``
canvas (an 8x8 scan exactly as :func:`~capsmed.data.sources.digits.reader.digit_images`
made the set); an image of the canvas's size is taken as it is."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from capsmed.data.sources.mnist.recipe import DigitImage

log = logging.getLogger(__name__)


class ScanImage(DigitImage):
    """A grey digit scan, light on black."""

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        scan = self.grey(path)
        native = (scan.shape[1], scan.shape[0])
        if scan.shape[:2] == self.shape:
            return scan.transpose(2, 0, 1), native
        box = int(self.record.preprocessing.get("box", 20))
        if scan.shape[:2] != (8, 8):
            log.info("%s: %dx%d, not an 8x8 scan; resized to the %d px box the set's "
                     "digits fill", path, scan.shape[1], scan.shape[0], box)
        # an 8x8 scan is enlarged by INTER_LINEAR, as the set's were
        return self.centred(scan, box).transpose(2, 0, 1), native
