"""What several test modules share: toy model widths and assertions."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def assert_clean_failure(result: Any, text: str, output: Path | None = None) -> None:
    """A CLI failure as promised: exit 1, one ``error:`` line containing ``text`` on
    stderr, and (given ``output``) no output and no temporary file beside it."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert text in lines[0], lines[0]
    if output is not None:
        assert not output.exists()
        assert not list(output.parent.glob(f".{output.name}*")), "temporary file left behind"


# Reduced widths: the same code paths as the paper models at a fraction of the compute.
TINY_CAPSNET = {"conv_channels": 16, "primary_types": 4, "primary_dim": 4, "class_dim": 8,
                "decoder_hidden": [32, 64]}
TINY_FC = {"channels": (4, 4, 4), "hidden": (8, 6)}
TINY = {"capsnet": TINY_CAPSNET, "aff-capsnet": TINY_CAPSNET,
        "lenet": {"widths": (3, 4), "hidden": (8,)},
        "baseline": TINY_FC, "convnet-fc": TINY_FC, "convnet-avg": {"channels": (4, 4)},
        "resnext50": {"layers": (1, 1, 1, 1), "planes": (4, 8, 8, 8), "cardinality": 2,
                      "base_width": 32, "stem_channels": 8},
        "convnet-cr": {"conv_channels": 16, "decoder_hidden": (16, 16)},
        "convnet-r": {"conv_channels": 16, "decoder_hidden": (16, 16)},
        "convnet-cr-sf": {"conv_channels": 16, "decoder_hidden": (16, 16)},
        "em-capsnet": {"stem_channels": 8, "stem_blocks": 2, "cardinality": 2, "base_width": 8,
                       "primary_types": 4},  # mid_types: only with capsule_layers 3-4
        "parallel-em": {"branches": 2, "stem_channels": 8, "stem_planes": (8,),
                        "branch_planes": 8, "cardinality": 2, "base_width": 16,
                        "primary_types": 4},
        "parallel-dr": {"branches": 3, "stem_channels": 8, "stem_planes": (4,),
                        "branch_planes": 4, "cardinality": 2, "base_width": 32,
                        "primary_dim": 8, "mid_dim": 4, "class_dim": 4}}


def folder_dataset(work: Path, images_per_class: int = 10, patients: int = 5) -> Path:
    """A class-folder set (3 shapes, 32 px, grouped by patient) under ``work/images``,
    preprocessed through the public API into ``work/shapes.h5`` (28 px grey)."""
    import capsmed
    from capsmed.data.sources.folder.synth import write_class_folders

    write_class_folders(work / "images", classes=3, images_per_class=images_per_class,
                        patients=patients, size=32, seed=0)
    return capsmed.preprocess("folder", work / "images", work / "shapes.h5", size=28,
                              channels=1, group_pattern=r"^(P\d+)_", workers=1,
                              fractions={"train": 0.6, "val": 0.2, "test": 0.2})


def folder_lenet(work: Path) -> tuple[Path, list[Path]]:
    """A tiny LeNet run trained one epoch on :func:`folder_dataset` (6 images a class,
    3 patients) in ``work``, and four of the set's image files."""
    import capsmed

    data = folder_dataset(work, images_per_class=6, patients=3)
    run = capsmed.train_run(data, "lenet", epochs=1, batch_size=8, seed=0, device="cpu",
                            out=str(work / "lenet"), model_kwargs=TINY["lenet"])
    return run, sorted((work / "images").rglob("*.png"))[:4]


def scored_capsnet(n: int) -> tuple[Any, dict, Any, Any]:
    """An untrained tiny 3-class capsnet (28 px grey, seeded), ``n`` random images and
    each image's classes from the highest score down: ``(model, kwargs, images,
    order)``, to write two-label files whose right answers are known."""
    import numpy as np
    import torch

    from capsmed.models import create_model

    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 3, "input_size": [28, 28], **TINY_CAPSNET}
    model = create_model("capsnet", **kwargs).eval()
    images = np.random.default_rng(0).integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    with torch.no_grad():
        order = model(torch.from_numpy(images).float() / 255).scores.argsort(1, True).numpy()
    return model, kwargs, images, order


def two_label_run(work: Path, model: Any, kwargs: dict, images: Any, first: Any,
                  second: Any) -> tuple[Path, Path]:
    """``work/two.h5``, a two-label test split of ``images`` (classes a, b, c), and
    ``work/run`` holding ``model``'s checkpoint for it: ``(data, run)``."""
    import numpy as np

    from capsmed.data.contract import DatasetWriter
    from capsmed.train.checkpoint import save_checkpoint

    data = work / "two.h5"
    with DatasetWriter(data, dataset="toy", kind="multimnist", domain="digits",
                       class_names=["a", "b", "c"], image_shape=(1, 28, 28),
                       preprocessing={}, source={}) as w:
        w.append("test", images, first, np.array([f"g{i}" for i in range(len(images))]),
                 meta={"label2": second})
    run = work / "run"
    run.mkdir()
    save_checkpoint(run, model, {"arch": "capsnet", "model_kwargs": kwargs, "epoch": 1,
                                 "data": str(data), "class_names": ["a", "b", "c"]})
    return data, run
