"""Evaluate a run directory on a split of its dataset (or another compatible file)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from capsmed.data.contract import load_split, read_info
from capsmed.errors import CapsmedError
from capsmed.evaluate.metrics import ClassificationReport, classification_report
from capsmed.evaluate.plots import plot_confusion_matrix
from capsmed.evaluate.report import write_report
from capsmed.train.checkpoint import load_checkpoint
from capsmed.train.engine import select_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """A finished evaluation: the report, where it was written and what it describes."""

    report: ClassificationReport
    report_dir: Path
    title: str


@torch.no_grad()
def predict_scores(model: torch.nn.Module, images: np.ndarray, device: torch.device,
                   batch_size: int = 512) -> np.ndarray:
    """Class scores [N, K] for uint8 images [N, C, H, W]."""
    out = []
    for start in range(0, len(images), batch_size):
        x = torch.from_numpy(images[start:start + batch_size]).to(device).float().div_(255.0)
        out.append(model(x).scores.float().cpu())
    return torch.cat(out).numpy() if out else np.empty((0, 0), dtype=np.float32)


def evaluate_run(run_dir: Path, split: str = "test", data: Path | None = None,
                 device: str = "auto", batch_size: int = 512) -> Evaluation:
    """Evaluate the checkpoint in ``run_dir`` on ``split``; write ``run_dir/report/``."""
    run_dir = Path(run_dir)
    dev = select_device(device)
    model, meta = load_checkpoint(run_dir, dev)
    data_path = Path(data) if data is not None else Path(meta["data"])
    info = read_info(data_path)
    if list(info.class_names) != list(meta["class_names"]):
        raise CapsmedError(f"{data_path}: classes {list(info.class_names)} do not match the "
                           f"checkpoint's {meta['class_names']}")
    kw = meta["model_kwargs"]
    if (info.channels, *info.image_size) != (kw["in_channels"], *kw["input_size"]):
        raise CapsmedError(f"{data_path}: images are {info.channels}x"
                           f"{info.image_size[0]}x{info.image_size[1]}, the model expects "
                           f"{kw['in_channels']}x{kw['input_size'][0]}x{kw['input_size'][1]}")
    split_data = load_split(data_path, split)
    scores = predict_scores(model, split_data.images, dev, batch_size)
    report = classification_report(split_data.labels, scores.argmax(axis=1),
                                   info.class_names)
    title = f"{meta['arch']} on {info.dataset} / {split} (epoch {meta['epoch']})"
    report_dir = run_dir / "report"
    context = {"run_dir": str(run_dir), "arch": meta["arch"], "dataset": info.dataset,
               "data": str(data_path), "split": split, "checkpoint_epoch": meta["epoch"],
               "samples": len(split_data)}
    write_report(report, report_dir, title, context)
    plot_confusion_matrix(report.confusion, info.class_names,
                          report_dir / "confusion_matrix.png", title=meta["arch"])
    for note in report.notes:
        log.warning(note)
    return Evaluation(report=report, report_dir=report_dir, title=title)
