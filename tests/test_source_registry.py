"""A new data source goes end to end through the source registry alone: a toy source
registered from the test suite (tests/toy_source/) is synthesised, preprocessed,
trained with the defaults of its recorded domain and predicted on, with no capsmed
module naming it."""

from __future__ import annotations

import json

import numpy as np
import yaml

import tests.toy_source  # noqa: F401 -- registers the toy source, as a new package would
from capsmed.data.contract import read_info
from capsmed.data.sources import get_source
from capsmed.predict.config import PredictOptions
from capsmed.predict.engine import predict
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train


def test_a_registered_toy_source_goes_synth_preprocess_train_predict(tmp_path):
    source = get_source("toy-dots")
    raw = source.hook("synth")(tmp_path / "raw", seed=1)
    data = source.hook("preprocess")(tmp_path / "raw", tmp_path / "toy.h5",
                                     source.config(size=20))
    info = read_info(data)
    assert info.data_source() is source and info.image_domain().name == "generic"
    run = train(TrainConfig(data=str(data), arch="lenet", epochs=2, batch_size=8, seed=0,
                            augment=True, out=str(tmp_path / "run")), disable_progress=True)
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert config["train"]["augment_recipe"] == "paper000-rotation"  # generic: no flips
    assert config["dataset"]["source_kind"] == "toy-dots"
    result = predict(run, raw[:3], tmp_path / "out",
                     PredictOptions(device="cpu", heatmaps=False))
    scores = np.concatenate([r.scores for r in result.results])
    assert scores.shape == (3, 2) and np.allclose(scores.sum(axis=1), 1, atol=1e-5)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dataset"] == "toy-dots" and summary["inputs"] == 3


def test_each_source_declares_its_split_only_parameters():
    """``Source.split_parameters`` (what ``evaluate --data`` does not count as other
    preprocessing) names only what the source records: a config field or a key its
    reader writes; the patch size and the like are never among them."""
    from dataclasses import fields
    from pathlib import Path

    from capsmed.data.sources import SPLIT_PARAMETERS, sources

    for source in sources():
        declared = getattr(source.config, "SPLIT_ONLY", frozenset())
        names = {f.name for f in fields(source.config)} if source.config else set()
        code = "".join(p.read_text() for p in Path(
            __import__(source.package, fromlist=["_"]).__file__).parent.glob("*.py"))
        unknown = [k for k in declared if k not in names and f'"{k}"' not in code
                   and f"{k}=" not in code]
        assert not unknown, f"{source.name}: SPLIT_ONLY names {unknown}"
        assert source.split_parameters == SPLIT_PARAMETERS | declared
        assert not source.split_parameters & {"patch_size", "output_size", "size",
                                              "h_max", "stain_norm", "placement"}
    assert {"val_fraction", "images"} <= get_source("diaretdb1").split_parameters
    assert "positives_per_mitosis" in get_source("tupac16").split_parameters
