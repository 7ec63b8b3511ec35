"""``capsmed predict`` on a run of the MNIST family (MNIST, Fashion-MNIST, affNIST): one
prediction per image, grey, resized to the run's input; on a set made with a placement
(``center40``, ``random40``) the digit is resized to its recorded size and centred on
the black canvas, as the set's images were made."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from capsmed.data.images import convert_channels, read_image, resize_image, to_uint8
from capsmed.data.replay.images import WholeImage, opaque

log = logging.getLogger(__name__)


class DigitImage(WholeImage):
    """A grey image of one digit or garment, light on black as the IDX files hold them."""

    def grey(self, path: Path) -> np.ndarray:
        """The file as grey (H, W, 1) uint8, warned about when it looks dark on light."""
        image = to_uint8(read_image(path), "full", path)
        image = convert_channels(opaque(path, image, self.record.dataset), 1)
        if image.mean() > 127:  # the digit sets are light strokes on black
            log.warning("%s: mostly light (mean %.0f of 255), but %s images are light "
                        "strokes on a black background; invert the image if its strokes "
                        "are dark", path, image.mean(), self.record.dataset)
        return image

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        image = self.grey(path)
        native = (image.shape[1], image.shape[0])
        placement = self.record.preprocessing.get("placement", "none")
        if placement != "none" and image.shape[:2] != self.shape:
            image = self._place(path, image, placement)
        if image.shape[:2] != self.shape:
            image = resize_image(image, self.shape[0], keep_aspect=False)
        return image.transpose(2, 0, 1), native

    def _place(self, path: Path, image: np.ndarray, placement: str) -> np.ndarray:
        """The digit at its recorded size, centred on the canvas as ``center40`` puts it
        (``random40``'s seeded position belongs to the set's own images)."""
        side = int((self.record.preprocessing.get("source_image_size") or [28])[0])
        if image.shape[:2] != (side, side):  # the family's digits are square
            log.info("%s: %dx%d, resized to the %d px digits the set placed on its canvas",
                     path, image.shape[1], image.shape[0], side)
        if placement == "random40":
            log.info("%s: centred on the %dx%d canvas (the set placed its digits at seeded "
                     "random positions, which belong to its own images)", path,
                     self.shape[1], self.shape[0])
        return self.centred(image, side)

    def centred(self, image: np.ndarray, side: int) -> np.ndarray:
        """(H, W, 1) ``image`` resized to ``side`` px (INTER_AREA shrinking, INTER_LINEAR
        enlarging) and centred on the run's black canvas."""
        if image.shape[:2] != (side, side):
            image = resize_image(image, side, keep_aspect=False)
        top, left = (self.shape[0] - side) // 2, (self.shape[1] - side) // 2
        canvas = np.zeros((*self.shape, 1), np.uint8)
        canvas[top:top + side, left:left + side] = image
        return canvas
