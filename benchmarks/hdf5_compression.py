"""Size and speed of the HDF5 image filters on image sets like capsmed's: none, LZF
(h5py's own filter, which h5dump, MATLAB and R cannot read) and gzip levels 1-9.

    python -m benchmarks.hdf5_compression

Chunks as capsmed/data/writer.py makes them (~1 MiB); each timing is the best of 3.
Sets: 28x28 hematoxylin patches of synthetic H&E (as TUPAC16's), non-overlapping
64x64 RGB tiles of scikit-image's real photographs (IHC histology, fundus, ...), and
28x28 synthetic digits.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import cv2
import h5py
import numpy as np
from skimage import data

from capsmed.data.sources.mnist.synth import render_digit
from capsmed.data.sources.tupac16.synth import render_tupac16_image
from capsmed.data.stains import hematoxylin_channel
from capsmed.data.writer import CHUNK_BYTES

FILTERS = (("none", None), ("lzf", None), ("gzip", 1), ("gzip", 4), ("gzip", 6), ("gzip", 9))


def tiles(image: np.ndarray, side: int) -> np.ndarray:
    """Non-overlapping ``side`` x ``side`` tiles of ``image``."""
    h, w = image.shape[:2]
    return np.stack([image[y:y + side, x:x + side] for y in range(0, h - side + 1, side)
                     for x in range(0, w - side + 1, side)])


def image_sets() -> dict[str, np.ndarray]:
    hema = []
    for k in range(40):
        h = hematoxylin_channel(render_tupac16_image(np.random.default_rng([0, k]), 1024).rgb)
        hema += [cv2.resize(p, (28, 28), interpolation=cv2.INTER_AREA) for p in tiles(h, 100)]
    photos = (data.immunohistochemistry, data.retina, data.astronaut, data.chelsea, data.coffee)
    rgb = np.concatenate([tiles(f(), 64) for f in photos]).transpose(0, 3, 1, 2)
    digits = [render_digit(np.random.default_rng([1, i]), i % 10) for i in range(20000)]
    return {"hematoxylin 28x28x1": np.stack(hema)[:, None],
            "photo tiles 64x64x3": np.ascontiguousarray(rgb),
            "digits 28x28x1": np.stack(digits)[:, None]}


def measure(x: np.ndarray, path: Path, compression: str, level: int | None
            ) -> tuple[int, float, float]:
    """File bytes, best write and best read seconds of ``x`` under one filter."""
    per = max(1, CHUNK_BYTES // int(np.prod(x.shape[1:])))
    write = read = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=x, chunks=(per, *x.shape[1:]),
                             compression=None if compression == "none" else compression,
                             compression_opts=level)
        write = min(write, time.perf_counter() - start)
        start = time.perf_counter()
        with h5py.File(path, "r") as f:
            f["x"][...]
        read = min(read, time.perf_counter() - start)
    return path.stat().st_size, write, read


def main() -> None:
    print(f"{'set':20} {'filter':7} {'MiB':>6} {'ratio':>6} {'write MiB/s':>11} "
          f"{'read MiB/s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in image_sets().items():
            mib = x.nbytes / 2**20
            for compression, level in FILTERS:
                size, write, read = measure(x, Path(tmp) / "x.h5", compression, level)
                label = compression + (f"-{level}" if level else "")
                print(f"{name:20} {label:7} {size / 2**20:6.2f} {x.nbytes / size:6.2f} "
                      f"{mib / write:11.0f} {mib / read:10.0f}")
            print(f"{'':20} ({len(x)} images, {mib:.1f} MiB raw)")


if __name__ == "__main__":
    main()
