"""Rough run times for ``capsmed run --dry-run``, from measured throughput.

Sources: the repository's ``benchmarks/results/`` (``gpu_check-*.jsonl``: GPU training
img/s per architecture and batch, eager bf16 as ``capsmed train`` runs by default;
``train.jsonl``: ``capsmed bench train`` lines) and your own ``capsmed bench train``
results in the user data folder (``capsmed.io.user_data_dir() / "bench"``). A run's
estimate is epochs x training images / img/s at the closest measured batch size:
training only, at the paper input size the figure was measured at, so an estimate,
not a promise. Architectures never measured get none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from capsmed.io import user_data_dir
from capsmed.pipeline.spec import RunSpec

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _result_files(folders: list[Path]) -> list[Path]:
    return [p for folder in folders if folder.is_dir() for p in sorted(folder.glob("*.jsonl"))]


def load_throughput(gpu: bool, results: Path = RESULTS) -> dict[str, list[tuple[int, float, str]]]:
    """arch -> [(batch size, training img/s, device)] for a GPU or a CPU machine."""
    table: dict[str, list[tuple[int, float, str]]] = {}
    for path in _result_files([results, user_data_dir() / "bench"]):
        device = ""
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):  # another tool's lines: not a training figure
                continue
            if row.get("part") == "speed" and row.get("mode") == "eager-bf16" and gpu:
                if "train_images_per_s" in row:
                    device = "H100" if "h100" in path.name else path.stem
                    table.setdefault(row["arch"], []).append(
                        (int(row["batch_size"]), float(row["train_images_per_s"]), device))
            elif "device" in row and "part" not in row and "train_images_per_s" in row:
                on_gpu = not str(row["device"]).startswith("cpu")
                if on_gpu == gpu:
                    table.setdefault(row["arch"], []).append(
                        (int(row["batch_size"]), float(row["train_images_per_s"]),
                         str(row["device"]).split(" (")[0]))
    return table


def training_images(run: RunSpec, split_sizes: dict[str, int]) -> int | None:
    """Images one epoch trains on (None when the data is not made yet).

    A subset protocol (fraction, imbalance, per-class limit) trains as many steps as
    the full split (paper 000 s3.1), so an epoch costs the full split's images; a
    cross-validation run trains on all folds but its test fold.
    """
    steps = run.train.get("steps_per_epoch")
    if steps:
        return int(steps) * int(run.train.get("batch_size", 128))
    if "train" in split_sizes:
        return split_sizes["train"]
    if "all" in split_sizes:
        k = int(run.train.get("folds") or 5)
        return split_sizes["all"] * (k - 1) // k
    return None


def estimate_seconds(run: RunSpec, throughput: dict[str, list[tuple[int, float, str]]],
                     split_sizes: dict[str, int]) -> float | None:
    figures = throughput.get(run.train.get("arch", ""))
    images = training_images(run, split_sizes)
    if not figures or images is None:
        return None
    batch = int(run.train.get("batch_size", 128))
    _, rate, _ = min(figures, key=lambda f: abs(math.log(f[0] / batch)))
    return int(run.train.get("epochs", 50)) * images / rate


def human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def split_sizes_of(path: Any) -> dict[str, int]:
    from capsmed.data.contract import read_info

    try:
        return dict(read_info(Path(path)).split_sizes)
    except Exception:  # not made yet, or unreadable: no estimate, never an error here
        return {}
