"""``capsmed predict`` on a MedMNIST run: one prediction per image file, taken as the
published arrays hold it.

MedMNIST's images were cropped and resized by its authors, differently per set (a
200 px centre crop for blood cells, a plain resize for pathology, ...), from source
images capsmed never saw; that cannot be replayed. So an input must already be a
MedMNIST image: the size the run was trained at (28, 64, 128 or 224 px square) and
its colour. A grey image is refused by a colour run; a colour image is accepted by a
grey run only when its three channels are equal (a grey image saved as RGB).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capsmed.data.images import read_image, to_uint8
from capsmed.data.replay.images import WholeImage, opaque
from capsmed.errors import CapsmedError


class MedmnistImage(WholeImage):
    """One MedMNIST image file (PNG, JPEG, TIFF, ...)."""

    def convert(self, path: Path) -> tuple[np.ndarray, tuple[int, int]]:
        image = opaque(path, to_uint8(read_image(path), "full", path), self.record.dataset)
        image = image if image.ndim == 3 else image[..., None]
        h, w = image.shape[:2]
        if (h, w) != self.shape:
            raise CapsmedError(f"{path}: image is {w}x{h}, but the run was trained on "
                               f"{self.record.dataset} images of {self.shape[1]}x"
                               f"{self.shape[0]}; MedMNIST's own crop and resize cannot "
                               "be replayed, so give images of that size")
        channels = image.shape[-1]
        if channels != self.channels:
            same = channels == 3 and (image[..., 0] == image[..., 1]).all() and \
                (image[..., 1] == image[..., 2]).all()
            if not same:
                raise CapsmedError(f"{path}: a {'colour' if channels == 3 else 'grey'} "
                                   f"image, but {self.record.dataset} images are "
                                   f"{'grey' if self.channels == 1 else 'colour (RGB)'}")
            image = image[..., :1]
        return np.ascontiguousarray(image.transpose(2, 0, 1)), (w, h)
