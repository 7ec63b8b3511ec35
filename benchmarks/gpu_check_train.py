"""gpu_check's ``train-modes`` part: ``capsmed train`` itself (its loop, handlers and
resume) in each speed mode on the device, against the eager run of the same options
(augmented runs too: a CUDA graph takes the augmentation's draws as inputs).

A CUDA graph replays the whole step with the learning rate, the epoch's sums and the
non-finite flag inside it, so a mistake there shows as a loss curve that leaves the
eager one: the runs use an exponential schedule (the graph is captured again each
epoch) and a training split that ends in a partial batch (which runs the plain
step). The last epoch's images/s of each run is ``capsmed train``'s own speed at
that batch, loop and validation bookkeeping included (the ``speed`` part times the
step alone).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

# (mode, precision); each is compared with ("eager", precision), or with
# ("eager+augment", precision) when augmented (paper 000's medical recipe on the
# device: a graph takes the draws as inputs, so its images must be the eager run's)
MODES = (("eager", "fp32"), ("cuda-graph", "fp32"), ("eager", "bf16"),
         ("cuda-graph", "bf16"), ("compile", "bf16"), ("compile+cuda-graph", "bf16"),
         ("eager+augment", "fp32"), ("cuda-graph+augment", "fp32"),
         ("eager+augment", "bf16"), ("compile+cuda-graph+augment", "bf16"))
# Largest relative difference of any epoch's train/val loss from the eager run's.
# fp32: the same kernels in another launch order; bf16: compile fuses and reorders.
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}
EPOCHS = 3


def toy_digits(path: Path, n_train: int, n_val: int, side: int = 28, classes: int = 10,
               seed: int = 0) -> Path:
    """A learnable MNIST-shaped set: noise, and a bright bar whose row is the class."""
    from capsmed.data.writer import DatasetWriter

    rng = np.random.default_rng(seed)
    n = n_train + n_val
    labels = rng.integers(0, classes, n)
    images = rng.integers(0, 64, (n, 1, side, side), dtype=np.uint8)
    for k in range(classes):
        row = 2 + 2 * k * (side - 6) // (2 * classes)
        images[labels == k, :, row:row + 2, 4:side - 4] = 255
    groups = [str(i) for i in range(n)]
    with DatasetWriter(path, dataset="gpu-check-digits", kind="mnist", domain="digits",
                       class_names=[str(k) for k in range(classes)],
                       image_shape=(1, side, side), preprocessing={}, source={}) as w:
        w.append("train", images[:n_train], labels[:n_train], groups[:n_train])
        w.append("val", images[n_train:], labels[n_train:], groups[n_train:])
    return path


def _config(data: Path, out: Path, dev: torch.device, quick: bool, mode: str,
            precision: str) -> Any:
    from capsmed.train.config import TrainConfig

    tiny = {"conv_channels": 16, "primary_types": 4, "primary_dim": 4, "class_dim": 8,
            "decoder_hidden": [32, 64]}
    return TrainConfig(data=str(data), arch="capsnet", epochs=EPOCHS,
                       batch_size=16 if quick else 128, lr=1e-3, recon_weight=5e-4,
                       lr_schedule="exponential", lr_decay=0.5, seed=0, device=str(dev),
                       precision=precision, compile="compile" in mode,
                       cuda_graph="cuda-graph" in mode, augment="augment" in mode,
                       augment_recipe="paper000-medical" if "augment" in mode else None,
                       patience=None, out=str(out),
                       model_kwargs=tiny if quick else {})


def _losses(run: Path) -> list[float]:
    import json

    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [v for line in lines for key in ("train_loss", "val_loss")
            for v in [json.loads(line)[key]]]


def _speed(run: Path) -> float:
    import json

    last = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1]
    return float(json.loads(last)["images_per_s"])


def _max_rel_diff(got: list[float], ref: list[float]) -> float:
    if len(got) != len(ref) or not all(math.isfinite(v) for v in got):
        return math.inf
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref, strict=True))


def _train(cfg: Any, stop_after_steps: int | None = None) -> Path:
    from capsmed.train.engine import train

    torch._dynamo.reset()  # a fresh compile cache per run
    return train(cfg, disable_progress=True, stop_after_steps=stop_after_steps)


def check_train_modes(report: Any, dev: torch.device, quick: bool, work: Path) -> None:
    """Each mode's run against the eager one; then a graph run (eager on a CPU)
    stopped inside an epoch and resumed, against its uninterrupted run."""
    import shutil

    work = work / "train-modes"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n_train = 40 if quick else 128 * 40 + 37  # the last batch is partial
    data = toy_digits(work / "digits.h5", n_train, 16 if quick else 1024)
    rows, reference, runs = [], {}, {}
    for mode, precision in MODES:
        name = f"{mode} {precision}"
        if (mode, precision) != MODES[0] and dev.type != "cuda":
            report.record("train-modes", name=name, skipped="GPU only")
            rows.append([mode, precision, "-", "-", "-", "GPU only"])
            continue
        started = time.monotonic()
        run = _train(_config(data, work / name.replace(" ", "-"), dev, quick, mode,
                             precision))
        losses = _losses(run)
        reference.setdefault((precision, "augment" in mode), losses)
        runs[name] = run
        diff = _max_rel_diff(losses, reference[precision, "augment" in mode])
        ok = diff <= TOLERANCE[precision]
        report.record("train-modes", name=name, losses=losses, max_rel_diff=diff,
                      tolerance=TOLERANCE[precision], images_per_s=_speed(run),
                      seconds=round(time.monotonic() - started, 1), ok=ok)
        rows.append([mode, precision, " ".join(f"{v:.4f}" for v in losses),
                     f"{diff:.1e} {'ok' if ok else 'FAIL'}", f"{_speed(run):,.0f}", ""])
    steps = math.ceil(n_train / (16 if quick else 128))
    rows.append(_check_resume(report, dev, quick, data, work, runs, steps))
    report.section("capsmed train in each mode", ["mode", "precision",
                   "train/val loss per epoch", "max rel. diff vs eager", "img/s", "note"],
                   rows, note=f"capsnet ({'toy widths' if quick else 'paper size'}), "
                   "'+augment': paper000-medical on the device, against eager+augment; "
                   f"{EPOCHS} epochs, batch {16 if quick else 128}, lr 1e-3 halved each "
                   "epoch, a partial last batch, on a learnable MNIST-shaped set; img/s is "
                   "the last epoch's from metrics.jsonl (the loop included). fp32 is IEEE "
                   f"fp32 (TF32 off). Tolerance: {TOLERANCE['fp32']:g} in fp32, "
                   f"{TOLERANCE['bf16']:g} in bf16.")


def _check_resume(report: Any, dev: torch.device, quick: bool, data: Path, work: Path,
                  runs: dict[str, Path], steps: int) -> list[Any]:
    """The graph run (eager on a CPU) stopped mid-epoch and resumed: its losses and
    weights against the uninterrupted run's."""
    from safetensors.torch import load_file

    from capsmed.train.engine import resume
    from capsmed.train.loop import TrainingInterrupted

    mode = "cuda-graph" if dev.type == "cuda" else "eager"
    cut = work / f"{mode}-fp32-resumed"
    cfg = _config(data, cut, dev, quick, mode, "fp32")
    stopped = False
    try:
        _train(cfg, stop_after_steps=steps + steps // 2)
    except TrainingInterrupted:
        stopped = True  # else it ran to the end and there is nothing to resume
    if stopped:
        torch._dynamo.reset()
        resume(cut, disable_progress=True)
    whole = runs[f"{mode} fp32"]
    diff = _max_rel_diff(_losses(cut), _losses(whole))
    a, b = (load_file(str(r / "checkpoint.safetensors")) for r in (whole, cut))
    weights = max(float((a[k].double() - b[k].double()).norm()
                        / b[k].double().norm().clamp_min(1e-30)) for k in a)
    ok = stopped and max(diff, weights) <= TOLERANCE["fp32"]
    report.record("train-modes", name=f"{mode} fp32 resumed", max_rel_diff=diff,
                  weights_rel_diff=weights, tolerance=TOLERANCE["fp32"], ok=ok)
    return [f"{mode}, stopped at step {steps + steps // 2} and resumed", "fp32", "-",
            f"{diff:.1e} (weights {weights:.1e}) {'ok' if ok else 'FAIL'}", "-",
            "against the uninterrupted run"]
