"""Toy raw files -> a capsmed dataset file, split by patient."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from capsmed.data.contract import DatasetWriter
from tests.toy_source import SOURCE
from tests.toy_source.config import ToyConfig
from tests.toy_source.synth import CLASSES


def load(path: Path, size: int) -> np.ndarray:
    """One raw file as the model's input (1, size, size)."""
    image = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    return cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)[None]


def preprocess_toy(raw_dir: Path, output: Path, config: ToyConfig) -> Path:
    files = sorted(Path(raw_dir).glob("*.png"))
    patients = sorted({f.name.split("_")[0] for f in files})
    order = np.random.default_rng(config.seed).permutation(len(patients))
    split_of = {patients[i]: ("train", "train", "train", "val", "test", "test")[k % 6]
                for k, i in enumerate(order)}
    with DatasetWriter(output, dataset="toy-dots", kind=SOURCE.name, domain=SOURCE.domain,
                       class_names=CLASSES, image_shape=(1, config.size, config.size),
                       preprocessing={"size": config.size, "seed": config.seed},
                       source={"raw_dir": str(raw_dir)}) as writer:
        for split in ("train", "val", "test"):
            chosen = [f for f in files if split_of[f.name.split("_")[0]] == split]
            images = np.stack([load(f, config.size) for f in chosen])
            labels = [CLASSES.index(f.name.split("_")[1]) for f in chosen]
            writer.append(split, images, labels, [f.name.split("_")[0] for f in chosen])
    return output
