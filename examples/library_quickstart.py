"""capsmed as a Python library: a class-folder dataset -> HDF5 -> train -> evaluate ->
predict on arrays -> export.

    python examples/library_quickstart.py [WORKDIR]

Each call is one command of the CLI (``capsmed preprocess folder``, ``train``,
``evaluate``, ``export``), through the public API in ``capsmed/api.py``. Replace the
synthetic folder with your own ``ROOT/<class>/<images>`` and a ``group_pattern`` that
finds the patient in each file name, so no patient is in two splits.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import capsmed
from capsmed.data.contract import load_split
from capsmed.data.sources.folder.synth import write_class_folders


def main(workdir: Path) -> dict:
    # 1. Images in class folders, file names P<patient>_<n>.png (here: synthetic shapes).
    root = workdir / "images"
    write_class_folders(root, classes=3, images_per_class=24, patients=8, size=32, seed=0)

    # 2. One HDF5 file: 28x28 grey images, split by patient (70/15/15 of the patients).
    #    Options are the flags of `capsmed preprocess folder` (domain: training defaults).
    data = capsmed.preprocess("folder", root, workdir / "shapes.h5", size=28, channels=1,
                              group_pattern=r"^(P\d+)_", seed=0, domain="generic")

    # 3. Train a (reduced-width) CapsNet; the run folder describes itself.
    run_dir = capsmed.train_run(
        data, "capsnet", epochs=2, batch_size=16, seed=0, device="cpu",
        out=str(workdir / "run"),
        model_kwargs={"conv_channels": 16, "primary_types": 4, "primary_dim": 4,
                      "class_dim": 8})

    # 4. Per-class precision / sensitivity on the held-out patients.
    evaluation = capsmed.evaluate_run(run_dir, split="test", grids=False,
                                      disable_progress=True)
    report = evaluation.report
    for name, row in report.per_class.items():
        print(f"{name:>10}: precision {row['precision']}, sensitivity {row['sensitivity']}")
    print(f"accuracy {report.accuracy:.3f}; report in {evaluation.report_dir}")

    # 5. The model on arrays (uint8 [N, C, H, W], as the dataset holds them), and as a
    #    file that runs without capsmed (torch.export here; ONNX with capsmed[export]).
    run = capsmed.load_run(run_dir)
    scores = run.predict(load_split(data, "test").images[:4])
    print("first test images:", [run.class_names[k] for k in scores.argmax(axis=1)])
    capsmed.export_run(run_dir, workdir / "capsnet.pt2", format="exported-program")
    return {"per_class": report.per_class, "accuracy": report.accuracy,
            "scores": scores.tolist()}


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="capsmed-")))
