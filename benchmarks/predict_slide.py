"""Windows per second of ``capsmed predict`` over a 4096x4096 synthetic slide.

Synthesises (untimed) one 4096x4096 pyramidal slide and two small training sets, makes
runs of lenet and capsnet (paper sizes) with one optimisation step each (their weights
do not change the speed), then times ``predict`` end to end: reading, preprocessing,
scoring and writing the CSV, heatmap and GeoJSON. Two workloads:

* ``wsi tiles``: a ``preprocess wsi`` run (128 px tiles at level 0, hematoxylin,
  resized to 28x28) over the slide's tissue tiles;
* ``tupac16 windows``: a TUPAC16 run (100 px windows, stride 50) read region by region.

The model-only rate (the same number of 28x28 windows through ``predict_scores``) is
given beside it, so the preprocessing share is visible. Prints a Markdown table and
appends one JSON line per row to ``--results``.

    .venv/bin/python benchmarks/predict_slide.py [--device cpu] [--batch-size 512]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from capsmed.data.sources.tupac16.config import Tupac16Config  # noqa: E402
from capsmed.data.sources.tupac16.reader import preprocess_tupac16  # noqa: E402
from capsmed.data.sources.tupac16.synth import write_tupac16  # noqa: E402
from capsmed.data.sources.wsi.config import WsiConfig  # noqa: E402
from capsmed.data.sources.wsi.reader import preprocess_wsi  # noqa: E402
from capsmed.data.sources.wsi.synth import write_wsi  # noqa: E402
from capsmed.device import device_name, select_device  # noqa: E402
from capsmed.predict.config import PredictOptions  # noqa: E402
from capsmed.predict.engine import predict  # noqa: E402
from capsmed.progress import set_progress_enabled  # noqa: E402
from capsmed.runs.checkpoint import load_checkpoint  # noqa: E402
from capsmed.runs.scores import predict_scores  # noqa: E402
from capsmed.train.config import TrainConfig  # noqa: E402
from capsmed.train.engine import train  # noqa: E402

SIDE = 4096


def _datasets(work: Path) -> dict[str, Path]:
    slides = write_wsi(work / "slides", slides=2, size=1024, seed=0, levels=2,
                       disable_progress=True)
    wsi = preprocess_wsi(slides, work / "wsi.h5", WsiConfig(
        tile_size=128, output_size=28, stain="hematoxylin", workers=1,
        slide_labels_csv=str(work / "slides" / "slide_labels.csv"),
        fractions={"train": 0.5, "val": 0.5, "test": 0.0}), disable_progress=True)
    write_tupac16(work / "tupac16", cases=3, images_per_case=1, size=512, seed=0)
    tupac = preprocess_tupac16(work / "tupac16", work / "tupac16.h5", Tupac16Config(
        positives_per_mitosis=2, workers=1,
        fractions={"train": 0.34, "val": 0.33, "test": 0.33}), disable_progress=True)
    return {"wsi tiles": wsi, "tupac16 windows": tupac}


def _run(data: Path, arch: str, out: Path) -> Path:
    return train(TrainConfig(data=str(data), arch=arch, epochs=1, steps_per_epoch=1,
                             batch_size=8, seed=0, device="cpu", out=str(out)),
                 disable_progress=True)


def _model_only(run_dir: Path, windows: int, device: torch.device, batch: int) -> float:
    model, _ = load_checkpoint(run_dir, device)
    images = np.random.default_rng(0).integers(0, 256, (windows, 1, 28, 28), dtype=np.uint8)
    predict_scores(model, images[:batch], device, batch)  # warm-up
    start = time.perf_counter()
    predict_scores(model, images, device, batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return windows / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--archs", default="lenet,capsnet")
    parser.add_argument("--results", type=Path,
                        default=Path(__file__).parent / "results" / "predict.jsonl")
    args = parser.parse_args()
    set_progress_enabled(False)
    logging.disable(logging.WARNING)  # the toy training sets miss classes; not news here
    device = select_device(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        big = write_wsi(work / "big", slides=1, size=SIDE, seed=7, levels=3,
                        disable_progress=True)[0]
        for workload, data in _datasets(work).items():
            for arch in args.archs.split(","):
                run_dir = _run(data, arch, work / f"run-{arch}-{workload.split()[0]}")
                options = PredictOptions(device=args.device, batch_size=args.batch_size)
                start = time.perf_counter()
                result = predict(run_dir, [big], work / f"out-{arch}-{len(rows)}", options)
                seconds = time.perf_counter() - start
                windows = sum(len(r.x) for r in result.results)
                rows.append({"workload": workload, "arch": arch, "windows": windows,
                             "seconds": round(seconds, 2),
                             "windows_per_s": round(windows / seconds, 1),
                             "model_only_per_s": round(_model_only(
                                 run_dir, windows, device, args.batch_size), 1)})
    header = (f"device: {device_name(device)}, torch {torch.__version__}, "
              f"{platform.machine()}, batch {args.batch_size}, one {SIDE}x{SIDE} slide")
    print(header + "\n")
    print("| workload | arch | windows | seconds | windows/s | model only /s |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['arch']} | {r['windows']:,} | {r['seconds']} | "
              f"{r['windows_per_s']:,.0f} | {r['model_only_per_s']:,.0f} |")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"part": "predict", "device": device_name(device),
                                 "torch": torch.__version__, "batch": args.batch_size,
                                 **r}) + "\n")


if __name__ == "__main__":
    main()
