"""scikit-learn's digit scans -> one dataset file, stratified seeded splits.

``load_digits`` holds 1,797 scans of 8x8 pixels with values 0..16 (the count of set
pixels in each 4x4 block of a 32x32 bitmap; UCI's optdigits test set, 13 writers who
are not recorded). Values are scaled to 0..255 (``round(v * 255 / 16)``), the scan is
enlarged to a ``box`` square and centred on a black canvas, strokes light on black
like MNIST.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.output import claims_output
from capsmed.data.sources.digits import SOURCE
from capsmed.data.sources.digits.config import DigitsConfig
from capsmed.data.splits import warn_missing_classes

log = logging.getLogger(__name__)

CLASS_NAMES = tuple(str(d) for d in range(10))


def digit_images(values: np.ndarray, cfg: DigitsConfig) -> np.ndarray:
    """uint8 [N, 1, size, size] from load_digits' float [N, 8, 8] values 0..16."""
    scans = np.rint(np.asarray(values, dtype=np.float64) * 255.0 / 16.0).astype(np.uint8)
    out = np.zeros((len(scans), 1, cfg.size, cfg.size), np.uint8)
    top = (cfg.size - cfg.box) // 2
    for i, scan in enumerate(scans):
        out[i, 0, top:top + cfg.box, top:top + cfg.box] = cv2.resize(
            scan, (cfg.box, cfg.box), interpolation=cv2.INTER_LINEAR)
    return out


def split_rows(labels: np.ndarray, cfg: DigitsConfig) -> dict[str, np.ndarray]:
    """Rows of each split: per class, a seeded shuffle cut at the fractions."""
    rng = np.random.default_rng(cfg.seed)
    rows: dict[str, list[int]] = {s: [] for s in cfg.fractions}
    for c in range(10):
        members = rng.permutation(np.flatnonzero(labels == c))
        edges = np.rint(np.cumsum([cfg.fractions[s] for s in cfg.fractions]) * len(members))
        for split, start, stop in zip(cfg.fractions, [0, *edges[:-1]], edges, strict=True):
            rows[split] += members[int(start):int(stop)].tolist()
    return {s: np.sort(np.asarray(r, dtype=np.int64)) for s, r in rows.items() if r}


@claims_output
def preprocess_digits(inputs: Path | None, output: Path, config: DigitsConfig | None = None,
                      overwrite: bool = False) -> Path:
    """Write scikit-learn's digits as a dataset file (``inputs`` is not used: the scans
    ship with scikit-learn)."""
    import sklearn
    from sklearn.datasets import load_digits

    cfg = config or DigitsConfig()
    bunch = load_digits()
    labels = np.asarray(bunch.target, dtype=np.int64)
    images = digit_images(bunch.images, cfg)
    parameters = {**asdict(cfg), "scale": "round(v * 255 / 16) of load_digits' 0..16",
                  "resize": "cv2.INTER_LINEAR to box, centred on black",
                  "groups": "one per image: the set records no writer, so a writer may "
                            "be in two splits"}
    source = {"raw_dir": "sklearn.datasets.load_digits", "scikit-learn": sklearn.__version__,
              "images": len(labels), "files": {}}
    splits = split_rows(labels, cfg)
    with DatasetWriter(output, dataset="digits", kind=SOURCE.name, domain=SOURCE.domain,
                       class_names=CLASS_NAMES, image_shape=(1, cfg.size, cfg.size),
                       preprocessing=parameters, source=source) as writer:
        for split, rows in splits.items():
            writer.append(split, images[rows], labels[rows],
                          [f"digit{r:04d}" for r in rows],
                          meta={"index": rows})
        warn_missing_classes({s: labels[r] for s, r in splits.items()}, CLASS_NAMES)
    log.info("no writer ids in scikit-learn's digits: each image is its own group")
    return Path(output)
