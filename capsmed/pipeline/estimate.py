"""Rough training times for ``capsmed run --dry-run``, from measured throughput only.

Rates come from :mod:`capsmed.pipeline.throughput` (shipped with capsmed) and from
your own ``capsmed bench train`` results in the user data folder (preferred). A run
gets an estimate only from a rate of its own architecture at its registry defaults,
its channels, its input size, its precision, the device kind it will train on and its
mode (eager, ``compile``, ``cuda_graph``), at the nearest measured batch size (within a
factor of 4): never from another input size, a reduced-width model or another mode.
Its input size and split sizes come from its data file, or, before the file exists,
from what its data stage declares under ``expect:``. The estimate is epochs x training
images per epoch / rate: training only (no evaluation, no early stop), one run at a
time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capsmed.io import user_data_dir
from capsmed.pipeline.spec import Pipeline, RunSpec
from capsmed.pipeline.throughput import RATES, Rate

MAX_BATCH_RATIO = 4.0
NOT_MODEL_OPTIONS = {"in_channels", "num_classes", "input_size", "input_mean", "input_std"}


def user_rates(folder: Path | None = None) -> list[Rate]:
    """``capsmed bench train`` lines of this user (other tools' lines are skipped)."""
    folder = folder if folder is not None else user_data_dir() / "bench"
    out = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text(encoding="utf-8").splitlines():
            rate = _bench_line(line, path.name)
            if rate is not None:
                out.append(rate)
    return out


def _bench_line(line: str, source: str) -> Rate | None:
    try:
        row = json.loads(line)
        if row.get("model_options"):  # not the registry's default model: no rate for it
            return None
        shape, _, classes = str(row["input"]).partition(", ")
        channels, size, _ = (int(v) for v in shape.split("x"))
        device = str(row["device"])
        kind = "cpu" if device.startswith("cpu") else "gpu:" + device.split("(")[-1].rstrip(")")
        precision = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
            str(row["precision"]), str(row["precision"]))
        if precision == "fp32" and "tf32" not in row and not device.startswith(
                ("cpu", "mps")):  # CUDA before fp32 meant IEEE fp32: cuDNN's TF32 default
            precision = "tf32-conv"
        return Rate(str(row["arch"]), channels, size, int(classes.split()[0]),
                    int(row["batch_size"]), precision, kind, float(row["train_images_per_s"]),
                    source, _mode(bool(row.get("compiled")), bool(row.get("cuda_graph"))))
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None


def _mode(compiled: bool, cuda_graph: bool) -> str:
    """A rate's mode: eager, compile, graph or compile+graph."""
    return "+".join(name for name, on in (("compile", compiled), ("graph", cuda_graph))
                    if on) or "eager"


def data_shape(pipeline: Pipeline, run: RunSpec) -> dict[str, Any] | None:
    """``{channels, image_size, splits}`` of the run's data: from the file, else from
    its stage's ``expect:``; None when neither is known."""
    path = Path(str(run.train.get("data")))
    if path.is_file():
        from capsmed.data.contract import class_counts, read_info

        try:
            info = read_info(path)
            height, width = info.image_size  # rates are of square inputs: (28, 28) is 28
            return {"channels": int(info.channels),
                    "image_size": int(height) if height == width else None,
                    "splits": dict(info.split_sizes), "folds": dict(info.folds),
                    "class_counts": {k: v.tolist() for k, v in class_counts(path).items()}}
        except Exception:  # unreadable here: the run itself will say why
            return None
    stage = pipeline.stages.get(run.stage or "")
    return dict(stage.expect) if stage is not None and stage.expect else None


def training_images(run: RunSpec, splits: Mapping[str, int],
                    counts: Mapping[str, list[int]] | None = None,
                    folds: Mapping[str, int] | None = None) -> int | None:
    """Images one epoch trains on. A subset protocol (fraction, imbalance) trains as
    many steps as the full split (paper 000 s3.1), so an epoch costs the full split's
    images; a per-class limit X first keeps at most X images of each class (``counts``:
    the split's images per class; without them no estimate); a cross-validation run
    (``fold``, on split ``all``) trains on all folds but one (``folds``: the file's
    number of folds per split, when the run does not give ``folds``)."""
    steps = run.train.get("steps_per_epoch")
    if steps:
        return int(steps) * int(run.train.get("batch_size", 128))
    split = "all" if run.train.get("fold") is not None else "train"  # as training picks
    if split not in splits:
        return None
    images = int(splits[split])
    limit = run.train.get("per_class_limit")
    if limit is not None:
        per_class = (counts or {}).get(split)
        if per_class is None:
            return None
        images = sum(min(int(n), int(limit)) for n in per_class)
    if split == "all":
        k = int(run.train.get("folds") or (folds or {}).get(split) or 5)
        return images * (k - 1) // k
    return images


def _default_model(run: RunSpec) -> bool:
    from capsmed.models.registry import get_model_entry

    try:
        defaults = get_model_entry(str(run.train.get("arch"))).defaults()
    except Exception:
        return False
    chosen = {k: v for k, v in (run.train.get("model_kwargs") or {}).items()
              if k not in NOT_MODEL_OPTIONS}
    return all(k in defaults and defaults[k] == v for k, v in chosen.items())


def matching_rate(run: RunSpec, shape: Mapping[str, Any], gpus: int,
                  rates: list[Rate]) -> Rate | None:
    device = "gpu" if gpus else "cpu"
    precision = str(run.train.get("precision") or "auto")
    if precision == "auto":
        precision = "bf16" if gpus else "fp32"
    batch = int(run.train.get("batch_size", 128))
    mode = _mode(bool(run.train.get("compile")), bool(run.train.get("cuda_graph")))
    found = [r for r in rates if r.arch == run.train.get("arch")
             and r.channels == shape["channels"] and r.size == shape["image_size"]
             and r.precision == precision and r.device.split(":")[0] == device
             and r.mode == mode
             and max(r.batch, batch) / min(r.batch, batch) <= MAX_BATCH_RATIO]
    return min(found, key=lambda r: abs(math.log(r.batch / batch))) if found else None


def estimate_run(pipeline: Pipeline, run: RunSpec, gpus: int,
                 rates: list[Rate] | None = None,
                 shapes: dict[str, Any] | None = None) -> tuple[float, Rate] | None:
    """Seconds of training and the rate they come from; None without a fitting rate
    (a multi-GPU run, whose scaling was not measured, gets none). ``shapes`` keeps
    each data file's shape across calls (a grid reads each file once)."""
    if gpus > 1 or not _default_model(run):
        return None
    shapes = shapes if shapes is not None else {}
    key = f"{run.train.get('data')}|{run.stage}"
    if key not in shapes:
        shapes[key] = data_shape(pipeline, run)
    shape = shapes[key]
    if shape is None:
        return None
    images = training_images(run, shape.get("splits") or {}, shape.get("class_counts"),
                             shape.get("folds"))
    rate = matching_rate(run, shape, gpus, rates if rates is not None
                         else [*user_rates(), *RATES])
    if rate is None or images is None:
        return None
    return int(run.train.get("epochs", 50)) * images / rate.images_per_s, rate


def human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def estimate_summary(found: Mapping[str, tuple[float, Rate]], total: int,
                     trained: int = 0) -> str:
    """The total, saying how many runs it covers and which measurements it uses;
    ``total`` runs are still to train, ``trained`` more are trained already (not
    counted: they do not train again)."""
    done = f"; {trained} run(s) trained already are not counted" if trained else ""
    runs = "runs to train" if trained else "runs"
    if not total:
        return f"no training left: all {trained} runs are trained"
    if not found:
        return (f"no estimate for any of the {total} {runs}: no rate was measured for "
                "their architecture, input size and device (capsmed bench train adds "
                f"your own){done}")
    seconds = sum(s for s, _ in found.values())
    devices = sorted({r.device.replace("gpu:", "") for _, r in found.values()})
    part = ("all" if len(found) == total else f"{len(found)} of") + f" {total} {runs}"
    rest = "" if len(found) == total else (f"; the other {total - len(found)} have no "
                                           "measured rate")
    return (f"estimated training time: {human(seconds)} for {part} (rates measured on "
            f"{', '.join(devices)}; one run at a time, training only){rest}{done}")
