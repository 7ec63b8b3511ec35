"""``capsmed bench train``: training and evaluation throughput of one architecture.

Runs the trainer's own step (:class:`capsmed.train.step.TrainStep`: same loss,
precision, memory format, optional compile) on random uint8 images held on the
device, so the figures are the model's speed, not the disk's. Warm-up steps are not
timed; the device is synchronised before and after the timed steps only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsmed import __version__
from capsmed.device import device_name, select_device
from capsmed.errors import CapsmedError
from capsmed.io import append_line, ensure_writable_dir
from capsmed.models import count_parameters
from capsmed.train.choices import PRECISIONS
from capsmed.train.model_options import build_model
from capsmed.train.optim import build_optimizer
from capsmed.train.step import (
    PRECISION_NAMES,
    GraphedTrainStep,
    StepSettings,
    TrainStep,
    float32_matmuls,
    forward,
    precision_mode,
    resolve_precision,
)

log = logging.getLogger(__name__)

# The papers' input setting per architecture: (channels, side, classes).
PAPER_SETTINGS = {
    "capsnet": (1, 28, 10), "lenet": (1, 28, 10), "baseline": (1, 28, 10),
    "convnet-avg": (1, 28, 10), "convnet-cr": (1, 28, 10), "convnet-r": (1, 28, 10),
    "convnet-cr-sf": (1, 28, 10), "em-capsnet": (1, 28, 10),
    "aff-capsnet": (1, 40, 10), "convnet-fc": (1, 40, 10),
    "resnext50": (3, 400, 15), "parallel-dr": (3, 400, 15), "parallel-em": (3, 400, 15),
}


@dataclass(frozen=True)
class BenchResult:
    """One benchmark line (also appended to the results file as JSON)."""

    arch: str
    device: str
    precision: str
    batch_size: int
    input: str
    parameters: int
    train_images_per_s: float
    train_step_ms: float
    eval_images_per_s: float
    peak_memory_mib: float | None  # None: not this model's alone (see gpu_peak)
    channels_last: bool
    compiled: bool
    cuda_graph: bool
    steps: int
    torch: str
    capsmed: str
    when: str
    tf32: bool = False  # TF32 matmuls and convolutions (only with --precision tf32)
    # --model-arg options: a line without them is the registry's default model, which
    # capsmed run --dry-run takes the line's rate for
    model_options: dict[str, Any] = field(default_factory=dict)


def gpu_peak(result: BenchResult) -> bool:
    """Whether ``result``'s peak is CUDA's ``max_memory_allocated`` (reset for each
    benchmark), not the process's peak RSS (which keeps every earlier benchmark's of
    the same process: ``capsmed bench train`` records it for the first only)."""
    return not result.device.startswith(("cpu", "mps"))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


def peak_rss_mib() -> float:
    """This process's peak resident memory (MiB), model and data included: Linux's
    ``VmHWM``, which starts anew with the program (``ru_maxrss`` does not: a process
    started by a large one, as a study worker by its runner, inherits that one's peak
    through fork and exec); ``ru_maxrss`` elsewhere."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    # ru_maxrss: KiB on Linux, bytes on macOS
    scale = 2**20 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def bench_train(arch: str, *, batch_size: int = 128, device: str = "auto", steps: int = 20,
                warmup: int = 5, precision: str = "auto", channels_last: bool | None = None,
                compile_model: bool = False, cuda_graph: bool = False,
                input_size: int | None = None,
                channels: int | None = None, num_classes: int | None = None,
                model_kwargs: dict[str, Any] | None = None, seed: int = 0) -> BenchResult:
    """Time ``steps`` training steps and as many evaluation batches of ``arch``.

    ``cuda_graph`` captures the whole training step (with the Adam update) as one CUDA
    graph after its warm-up (:class:`GraphedTrainStep`; CUDA only, fp32, tf32 or bf16);
    the warm-up then has at least the graph's own warm-up steps plus its capture.
    ``precision`` fp32 is IEEE fp32 (TF32 off), as in ``capsmed train``.
    """
    _check_options(batch_size=batch_size, steps=steps, warmup=warmup, input_size=input_size,
                   channels=channels, num_classes=num_classes, precision=precision)
    _check_model_options(model_kwargs or {})
    if compile_model and warmup < 1:  # the first step compiles: it would be timed
        raise CapsmedError("--compile needs --warmup 1 or more: the first step compiles "
                           "the model, and its seconds would count as training time")
    dev = select_device(device)
    # even without --compile (--cuda-graph raises the warm-up past its capture below)
    if dev.type == "cuda" and warmup < 1 and not cuda_graph:
        raise CapsmedError("--warmup 0 on a GPU: the first step compiles the capsule "
                           "routing (capsmed compiles it on CUDA unless "
                           "CAPSMED_COMPILE_ROUTING=0) and loads the GPU's kernels, and "
                           "its seconds would count as training time; give --warmup 1 or "
                           "more")
    mode = precision_mode(precision, dev)
    if cuda_graph and (dev.type != "cuda" or mode == "fp16"):
        raise CapsmedError("--cuda-graph needs a CUDA device" if dev.type != "cuda" else
                           "--cuda-graph does not work with fp16; use --precision bf16")
    c, side, k = PAPER_SETTINGS.get(arch, (1, 28, 10))
    c = c if channels is None else channels
    side = side if input_size is None else input_size
    k = k if num_classes is None else num_classes
    torch.manual_seed(seed)
    model = build_model(arch, {"in_channels": c, "num_classes": k, "input_size": side,
                               **(model_kwargs or {})}, (c, side, side)).to(dev)
    use_cl = channels_last if channels_last is not None else dev.type == "cuda"
    if use_cl:
        model = model.to(memory_format=torch.channels_last)
    module = torch.compile(model) if compile_model else model
    settings = StepSettings(loss_kind=model.loss_kind, recon_weight=5e-4,
                            autocast_dtype=resolve_precision(precision, dev),
                            channels_last=use_cl)
    step: TrainStep | GraphedTrainStep = TrainStep(
        module, build_optimizer("adam", model.parameters(), 1e-3), settings)
    if cuda_graph:
        step = GraphedTrainStep(step)
        warmup = max(warmup, step.warmup + 1)  # replays only in the timed steps
    generator = torch.Generator(device=dev).manual_seed(seed)
    images = torch.randint(0, 256, (4 * batch_size, c, side, side), dtype=torch.uint8,
                           device=dev, generator=generator)
    labels = torch.randint(0, k, (4 * batch_size,), device=dev, generator=generator)

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = (i % 4) * batch_size
        return images[j:j + batch_size].float().div_(255.0), labels[j:j + batch_size]

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with float32_matmuls(mode):
        model.train()
        times = _time_steps(lambda i: step(*batch(i)), steps, warmup, dev)
        model.eval()
        with torch.no_grad():
            eval_times = _time_steps(lambda i: forward(module, batch(i)[0], None, settings),
                                     steps, warmup, dev)
    total = sum(times)
    return BenchResult(
        arch=arch, device=device_name(dev), precision=PRECISION_NAMES[mode],
        batch_size=batch_size, input=f"{c}x{side}x{side}, {k} classes",
        parameters=count_parameters(model),
        train_images_per_s=round(steps * batch_size / total, 1),
        train_step_ms=round(1000 * (statistics.median(times) if dev.type != "cuda"
                                    else total / steps), 3),
        eval_images_per_s=round(steps * batch_size / sum(eval_times), 1),
        peak_memory_mib=round(_peak_memory_mib(dev), 1), channels_last=use_cl,
        compiled=compile_model, cuda_graph=cuda_graph, steps=steps, torch=str(torch.__version__),
        capsmed=__version__, when=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        tf32=mode == "tf32", model_options=dict(model_kwargs or {}))


def _check_options(*, precision: str, **values: int | None) -> None:
    least = {"batch_size": 1, "steps": 1, "warmup": 0, "input_size": 1, "channels": 1,
             "num_classes": 2}
    for name, value in values.items():
        if value is not None and value < least[name]:
            raise CapsmedError(f"--{name.replace('_', '-')} must be >= {least[name]}, got "
                               f"{value}")
    if precision not in PRECISIONS:
        raise CapsmedError(f"--precision must be one of {', '.join(PRECISIONS)}, got "
                           f"{precision!r}")


# Model options that are the benchmark's input shape: given as --model-arg they built a
# model for other inputs than the images timed and the line records.
SHAPE_OPTIONS = {"in_channels": "--channels", "num_classes": "--num-classes",
                 "input_size": "--input-size"}


def _check_model_options(model_kwargs: dict[str, Any]) -> None:
    for key, option in SHAPE_OPTIONS.items():
        if key in model_kwargs:
            raise CapsmedError(f"--model-arg {key}: the input shape is set with {option}, "
                               "not as a model option")


def _time_steps(run_step: Callable[[int], object], steps: int, warmup: int,
                dev: torch.device) -> list[float]:
    """Seconds of each of ``steps`` calls after ``warmup`` untimed ones. On a GPU the
    device is synchronised before the first and after the last only, so the per-step
    figures are launch times and only their total is trusted."""
    for i in range(warmup):
        run_step(i)
    _sync(dev)
    times = []
    for i in range(steps):
        started = time.perf_counter()
        run_step(i)
        if i == 0 or i == steps - 1 or dev.type != "cuda":
            _sync(dev)
        times.append(time.perf_counter() - started)
    _sync(dev)
    return times


def append_result(result: BenchResult, path: Path) -> None:
    """Append one JSON line (with the host name) to ``path``. After a line cut short
    (a full disk, a killed writer) the result starts a line of its own: appended to
    the cut one, both would be lost to a reader."""
    path = Path(path)
    ensure_writable_dir(path.parent)
    line = json.dumps({**asdict(result), "host": platform.node()})
    append_line(path, "\n" + line if _ends_mid_line(path) else line)


def _ends_mid_line(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            if fh.seek(0, 2) == 0:
                return False
            fh.seek(-1, 2)
            return fh.read(1) != b"\n"
    except OSError:  # none yet, or not a file: append_line says why it cannot write
        return False
