"""capsmed as a Python library: a class-folder dataset -> HDF5 -> train -> evaluate.

    python examples/library_quickstart.py [WORKDIR]

Every step is the same function the CLI calls (``capsmed synth folder``, ``capsmed
preprocess folder``, ``capsmed train``, ``capsmed evaluate``). Replace the synthetic
folder with your own ``ROOT/<class>/<images>`` and a ``group_pattern`` that finds the
patient in each file name, so no patient is in two splits.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from capsmed.data.sources.folder.reader import FolderConfig, preprocess_folder
from capsmed.data.sources.folder.synth import write_class_folders
from capsmed.evaluate.evaluation import evaluate_run
from capsmed.train.config import TrainConfig
from capsmed.train.engine import train


def main(workdir: Path) -> dict:
    # 1. Images in class folders, file names P<patient>_<n>.png (here: synthetic shapes).
    root = workdir / "images"
    write_class_folders(root, classes=3, images_per_class=24, patients=8, size=32, seed=0)

    # 2. One HDF5 file: 28x28 grey images, split by patient (70/15/15 of the patients).
    data = preprocess_folder(root, workdir / "shapes.h5", FolderConfig(
        size=28, channels=1, group_pattern=r"^(P\d+)_", seed=0))

    # 3. Train a (reduced-width) CapsNet; the run folder describes itself.
    run_dir = train(TrainConfig(
        data=str(data), arch="capsnet", epochs=2, batch_size=16, seed=0, device="cpu",
        out=str(workdir / "run"),
        model_kwargs={"conv_channels": 16, "primary_types": 4, "primary_dim": 4,
                      "class_dim": 8}), disable_progress=True)

    # 4. Per-class precision / sensitivity on the held-out patients.
    evaluation = evaluate_run(run_dir, split="test", grids=False, disable_progress=True)
    report = json.loads((evaluation.report_dir / "report.json").read_text())
    for name, row in report["per_class"].items():
        print(f"{name:>10}: precision {row['precision']}, sensitivity {row['sensitivity']}")
    print(f"accuracy {report['accuracy']:.3f}; report in {evaluation.report_dir}")
    return report


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="capsmed-")))
