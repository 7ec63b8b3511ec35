"""Shared fixtures: tiny synthetic TUPAC16 data, preprocessed once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from capsmed.progress import set_progress_enabled


@pytest.fixture(autouse=True, scope="session")
def _quiet_progress():
    set_progress_enabled(False)
    yield


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory) -> Path:
    """Synthetic TUPAC16 in the official layout: 5 cases x 2 images of 256x256."""
    from capsmed.data.sources.tupac16.synth import write_tupac16

    root = tmp_path_factory.mktemp("raw") / "tupac16"
    write_tupac16(root, cases=5, images_per_case=2, size=256, seed=3)
    return root


@pytest.fixture(scope="session")
def tiny_h5(tiny_raw, tmp_path_factory) -> Path:
    """``tiny_raw`` preprocessed with few patches per mitosis (fast)."""
    from capsmed.data.sources.tupac16.reader import Tupac16Config, preprocess_tupac16

    out = tmp_path_factory.mktemp("h5") / "tupac16.h5"
    cfg = Tupac16Config(positives_per_mitosis=4, workers=1, seed=0,
                        fractions={"train": 0.6, "val": 0.2, "test": 0.2})
    return preprocess_tupac16(tiny_raw, out, cfg)
