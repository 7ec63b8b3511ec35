"""Fixtures of the fault tests: a small dataset written in a second, and a run on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from capsmed.data.contract import DatasetWriter
from tests.faults.common import TINY_LENET


def write_toy(path: Path, seed: int = 0, sizes: dict[str, int] | None = None) -> Path:
    """A two-class 1x28x28 set whose classes differ in brightness (learnable at once)."""
    rng = np.random.default_rng(seed)
    with DatasetWriter(path, dataset="toy", kind="folder", domain="generic",
                       class_names=["dark", "bright"],
                       image_shape=(1, 28, 28), preprocessing={"seed": seed},
                       source={}) as writer:
        for split, n in (sizes or {"train": 48, "val": 16, "test": 16}).items():
            labels = np.arange(n) % 2
            images = (rng.random((n, 1, 28, 28)) * 60 + labels[:, None, None, None] * 150)
            writer.append(split, images.astype(np.uint8), labels,
                          [f"{split}-{i // 4}" for i in range(n)])
    return path


@pytest.fixture(scope="session")
def toy_h5(tmp_path_factory) -> Path:
    """A pristine dataset; tests that change a file work on a copy (``toy_copy``)."""
    return write_toy(tmp_path_factory.mktemp("toy") / "toy.h5")


@pytest.fixture
def toy_copy(toy_h5, tmp_path) -> Path:
    copy = tmp_path / "data" / "toy.h5"
    copy.parent.mkdir()
    shutil.copy(toy_h5, copy)
    return copy


@pytest.fixture(scope="session")
def toy_run(toy_h5, tmp_path_factory) -> Path:
    """A finished one-epoch lenet run on ``toy_h5`` (copy it before changing it)."""
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    out = tmp_path_factory.mktemp("runs") / "lenet"
    return train(TrainConfig(data=str(toy_h5), arch="lenet", epochs=1, batch_size=16,
                             out=str(out), model_kwargs=TINY_LENET), disable_progress=True)


@pytest.fixture
def run_copy(toy_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(toy_run, copy)
    return copy
