"""Tumour maps of new whole slides: tiles from annotated slides -> train -> predict.

    python examples/predict_slides.py [WORKDIR]

The same functions the CLI calls: ``capsmed synth wsi``, ``capsmed preprocess wsi
--geojson``, ``capsmed train`` and ``capsmed predict``. Replace the synthetic slides
with your own (any OpenSlide format) and their QuPath GeoJSON exports. The prediction
replays the training tiling (level, tile size, tissue mask, resize) from the run's
``preprocessing.json``, and writes a heatmap and a GeoJSON per slide that QuPath opens
over the slide (File > Import objects).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from capsmed.data.sources.wsi.reader import WsiConfig, preprocess_wsi
from capsmed.data.sources.wsi.synth import write_wsi
from capsmed.predict.config import PredictOptions
from capsmed.predict.engine import predict
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train


def main(workdir: Path, epochs: int = 10, size: int = 2048) -> dict:
    # 1. Five slides with tumour outlines (QuPath GeoJSON); the last one is kept for predict.
    slides = write_wsi(workdir / "slides", slides=5, size=size, seed=0)
    annotated, new = slides[:4], slides[4:]

    # 2. 64 px tissue tiles at level 0 -> 28x28 RGB, labelled by the polygons, split by slide.
    data = preprocess_wsi(annotated, workdir / "tiles.h5", WsiConfig(
        tile_size=64, output_size=28, geojson=(str(workdir / "slides" / "annotations"),),
        fractions={"train": 0.75, "val": 0.25, "test": 0.0}))

    # 3. A LeNet baseline (use arch="capsnet" for the capsule network); tumour tiles are
    #    few, so every batch holds as many of each class.
    run_dir = train(TrainConfig(data=str(data), arch="lenet", epochs=epochs, batch_size=32,
                                sampler="balanced", seed=0, out=str(workdir / "run")))

    # 4. The new slide: every tissue tile scored; tumour tiles above 0.5 go to the GeoJSON.
    result = predict(run_dir, new, workdir / "predictions",
                     PredictOptions(class_name="Tumor", threshold=0.5))
    summary = json.loads((workdir / "predictions" / "summary.json").read_text())
    print(f"{summary['windows']} tiles, {summary['positives']} tumour tiles; heatmaps and "
          f"GeoJSON in {result.out_dir}/")
    return summary


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
