"""Raw toy files: RAW/<patient>_<class>_<n>.png, grey squares with a few or many dots."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

CLASSES = ("few", "many")


def write_toy(out_dir: Path, *, patients: int = 6, per_class: int = 4, seed: int = 0
              ) -> list[Path]:
    rng = np.random.default_rng(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in range(patients):
        for label, name in enumerate(CLASSES):
            for n in range(per_class):
                image = np.zeros((32, 32), np.uint8)
                for _ in range(2 + 12 * label):
                    y, x = rng.integers(2, 30, 2)
                    image[y - 1:y + 2, x - 1:x + 2] = 255
                path = out_dir / f"p{p}_{name}_{n}.png"
                cv2.imwrite(str(path), image)
                paths.append(path)
    return paths
