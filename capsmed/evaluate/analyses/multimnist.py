"""MultiMNIST two-digit accuracy (Sabour et al.; paper 004 section 3.2).

A test image holds two overlaid digits of different classes; the model is right when
its two highest class scores are exactly those two classes. Also reported: the share
of images where each digit is among the top two, and the accuracy per class pair
member (how often a digit of class c is found), so a model that finds only the
brighter digit shows up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from capsmed.data.contract import SECOND_LABEL, checked_second_labels
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses.common import (
    analysis_dir,
    class_scores,
    load_samples,
    open_analysed,
    two_digit_hits,
    write_csv,
    write_json,
)


@dataclass(frozen=True)
class MultiMnistResult:
    """What ``capsmed analyze multimnist`` measured."""

    run_dir: str
    split: str
    samples: int
    two_digit_accuracy: float
    first_found: float
    second_found: float
    per_class_found: dict[str, float]


def analyze_multimnist(run_dir: Path, device: str = "auto", data: Path | None = None,
                       split: str = "test", batch_size: int = 256) -> tuple[MultiMnistResult,
                                                                             Path]:
    """Two-digit accuracy of ``run_dir`` on a two-label (MultiMNIST) split."""
    run = open_analysed(run_dir, data, device)
    samples = load_samples(run, split, with_meta=True)
    if SECOND_LABEL not in samples.meta:
        raise CapsmedError(f"{run.data_path}: split '{split}' has no second label (meta "
                           f"'{SECOND_LABEL}'); make it with capsmed preprocess multimnist")
    # paper 004: the two digits are of different classes
    first = samples.labels
    second = checked_second_labels(first, samples.meta[SECOND_LABEL], len(run.class_names),
                                   run.data_path, split)
    scores = class_scores(run.model, samples.images, run.device, batch_size)
    both, a, b = two_digit_hits(scores, first, second)
    found = np.concatenate([a, b])
    digits = np.concatenate([first, second])
    per_class = {name: float(found[digits == c].mean())
                 for c, name in enumerate(run.class_names) if (digits == c).any()}
    result = MultiMnistResult(run_dir=str(run_dir), split=split, samples=len(first),
                              two_digit_accuracy=float(both.mean()),
                              first_found=float(a.mean()), second_found=float(b.mean()),
                              per_class_found=per_class)
    out = analysis_dir(run.run_dir, "multimnist")
    # which file and weights were scored, as the other analyses record them
    write_json(out / "multimnist.json", {**asdict(result), "data": str(run.data_path),
                                         "checkpoint_epoch": run.meta.get("epoch")})
    write_csv(out / "multimnist.csv", ["class", "found"],
              [[name, v] for name, v in per_class.items()])
    return result, out
