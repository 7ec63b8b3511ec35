"""MultiMNIST (Sabour et al. 2017, section 6) generated from the MNIST IDX files.

Each sample overlays two digits of different classes from the same split: both 28x28
digits are padded to 36x36 and shifted by up to +-4 px per axis (independently), and
the pixels are summed and clipped, ``min(a + b, 255)``. Every source image is the
first digit of ``pairs`` samples (Sabour et al. made 1,000 per digit; paper 004 uses 1
to 1,000); its partner is drawn uniformly among the split's images of other classes.
Pairs never cross splits: train pairs come from the training images, val from the
seeded validation sample, test from ``t10k``.

Beyond the single-label contract, the file stores the second label and both shifted
digits, so two-digit accuracy and the per-digit reconstruction loss can be computed::

    /<split>/labels           int64 [N]  class of the first digit
    /<split>/meta/label2      int64 [N]  class of the second digit (never equal)
    /<split>/meta/image_a     uint8 [N, 1, 36, 36]  first digit, shifted
    /<split>/meta/image_b     uint8 [N, 1, 36, 36]  second digit, shifted
    /<split>/meta/source_a, source_b  str  source image ids (train-000123, t10k-...)
    /<split>/meta/shift_a, shift_b    int8 [N, 2]  (dy, dx) of each digit
    /<split>/groups           str  = source_a (MNIST has no patients)
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np

from capsmed.data.contract import DatasetWriter
from capsmed.data.output import claims_output
from capsmed.data.sources.mnist import MULTIMNIST
from capsmed.data.sources.mnist.config import MultiMnistConfig
from capsmed.data.sources.mnist.reader import (
    MNIST_CLASSES,
    SPLIT_CODES,
    load_mnist_splits,
    place_on_canvas,
)
from capsmed.errors import CapsmedError
from capsmed.progress import make_progress

log = logging.getLogger(__name__)

CHUNK_PAIRS = 16384  # samples per write: ~64 MB with sources; few appends (leak checks)


def draw_partners(labels: np.ndarray, first: np.ndarray, rng: np.random.Generator
                  ) -> np.ndarray:
    """For each index in ``first``, a uniformly drawn index of another class.

    Vectorised: sort the split by class; a draw in ``[0, n - count(c))`` skips over
    class ``c``'s block of the sorted order.
    """
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=int(labels.max()) + 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    c = labels[first]
    others = len(labels) - counts[c]
    if (others == 0).any():
        raise CapsmedError("MultiMNIST needs at least two classes in every split")
    r = (rng.random(len(first)) * others).astype(np.int64)
    r = np.minimum(r, others - 1)  # guard float rounding at the top end
    r = np.where(r >= starts[c], r + counts[c], r)
    return order[r]


def overlay(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sabour et al.'s merge of two uint8 images: ``min(a + b, 255)``."""
    return np.minimum(a.astype(np.uint16) + b, 255).astype(np.uint8)


def make_chunk(images: np.ndarray, labels: np.ndarray, first: np.ndarray,
               rng: np.random.Generator, shift: int) -> dict[str, np.ndarray]:
    """Build the samples whose first digits are ``first`` (indices into the split)."""
    second = draw_partners(labels, first, rng)
    n = len(first)
    shifts = rng.integers(-shift, shift + 1, size=(2, n, 2))
    canvas = images.shape[1] + 2 * shift
    a = place_on_canvas(images[first], shift + shifts[0], canvas)
    b = place_on_canvas(images[second], shift + shifts[1], canvas)
    return {"first": first, "second": second, "a": a, "b": b, "merged": overlay(a, b),
            "shift_a": shifts[0].astype(np.int8), "shift_b": shifts[1].astype(np.int8)}


@claims_output
def preprocess_multimnist(raw_dir: Path, output: Path, config: MultiMnistConfig | None = None,
                          disable_progress: bool | None = None, overwrite: bool = False
                          ) -> Path:
    """Generate MultiMNIST from MNIST IDX files into one HDF5 dataset file (atomically).

    Args:
        raw_dir: Folder with the four MNIST IDX files (``.gz`` or plain).
        output: The ``.h5`` file to write.
        config: Pairs per source image, shift, validation size, seed.
        disable_progress: Hide the progress bar.
        overwrite: Replace ``output`` if it exists (otherwise that is an error).

    Returns:
        ``output``.
    """
    cfg = config or MultiMnistConfig()
    splits, source = load_mnist_splits(raw_dir, "mnist", cfg.val, cfg.seed)
    size = next(iter(splits.values())).images.shape[1]
    canvas = size + 2 * cfg.shift
    per_source = {s: cfg.pairs if s == "train" else (cfg.eval_pairs or cfg.pairs)
                  for s in splits}
    parameters = {**asdict(cfg), "canvas": canvas, "image_size": [canvas, canvas],
                  "merge": "min(a+b,255)", "pairs_used": per_source,
                  "val_count": len(splits["val"]) if "val" in splits else 0,
                  "partner": "uniform over the split's images of another class",
                  "labels": "first digit; meta/label2 = second digit",
                  "groups": "source id of the first digit (<file>-<index>)"}
    total = sum(len(d) * per_source[s] for s, d in splits.items())
    writer = DatasetWriter(output, dataset="multimnist", kind=MULTIMNIST.name,
                           domain=MULTIMNIST.domain, class_names=MNIST_CLASSES,
                           image_shape=(1, canvas, canvas), preprocessing=parameters,
                           source=source)
    with writer, make_progress(disable=disable_progress) as progress:
        task = progress.add_task("MultiMNIST pairs", total=total)
        for split, data in splits.items():
            k = per_source[split]
            # Each sample's first digit, in source order; chunks of whole sources.
            sources_per_chunk = max(1, CHUNK_PAIRS // k)
            for block, start in enumerate(range(0, len(data), sources_per_chunk)):
                rng = np.random.default_rng([cfg.seed, 2, SPLIT_CODES[split], block])
                first = np.repeat(np.arange(start, min(start + sources_per_chunk, len(data))), k)
                chunk = make_chunk(data.images, data.labels, first, rng, cfg.shift)
                meta = {"label2": data.labels[chunk["second"]],
                        "source_a": data.ids[chunk["first"]],
                        "source_b": data.ids[chunk["second"]],
                        "shift_a": chunk["shift_a"], "shift_b": chunk["shift_b"]}
                if cfg.store_sources:
                    meta.update(image_a=chunk["a"][:, None], image_b=chunk["b"][:, None])
                writer.append(split, chunk["merged"][:, None], data.labels[chunk["first"]],
                              data.ids[chunk["first"]], meta=meta)
                progress.advance(task, len(first))
    log.info("%s: MultiMNIST %s", output,
             ", ".join(f"{s}={len(d) * per_source[s]}" for s, d in splits.items()))
    return Path(output)
