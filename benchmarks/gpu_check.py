"""One command that checks capsmed on a GPU and measures its speed.

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out benchmarks/results   # make gpu-check

Parts (``--parts``, all by default), each written as it finishes to ``OUT/gpu_check.md``
(a Markdown report) and ``OUT/gpu_check.jsonl`` (one JSON line per check or figure):

* ``correctness``: every registered architecture: the device's fp32 forward against
  the CPU's on the same weights and inputs (TF32 off; relative L2 difference of the
  class scores within ``FORWARD_TOLERANCE``); 20 training steps on one fixed batch in
  fp32, bf16 and fp16 (every loss finite, the loss goes down); and, on CUDA, steps 4-20
  under ``torch.cuda.set_sync_debug_mode("error")``: a step that waits for the GPU fails.
* ``train-modes``: ``capsmed train`` (loop, handlers, resume) eager, with
  ``--cuda-graph``, ``--compile`` and both, in fp32 and bf16, against the eager run;
  a graph run stopped mid-epoch and resumed; each mode's training img/s.
* ``demo``: synth -> preprocess -> train -> evaluate through the CLI on the device, with
  the per-class report.
* ``ddp``: ``torchrun --nproc-per-node N`` (NCCL) for N = 1 .. the GPUs present, against
  the single-process run's loss curve.
* ``speed``: ``capsmed bench train`` figures (img/s, peak memory) per architecture at its
  paper's input size, in eager fp32 (IEEE: TF32 off), eager bf16, compiled bf16 and
  CUDA-graph bf16, at several batch sizes; and a textbook eager fp32 CapsNet
  (``reference_capsnet.py``) timed in the same process, for the speed-up ratio.
* ``memory``: parallel-dr at 128 px, 12 branches, batch 15; the largest batch that fits
  for each paper input size.
* ``concurrent``: N capsnet trainings at once on one GPU, their summed img/s.

Runs where only a system Python with torch exists: nothing is installed or downloaded
(openslide is never imported). ``--device cpu --quick`` runs every code path at toy
size on a CPU (the test suite does). Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_check_parts import (  # noqa: E402
    check_concurrent,
    check_ddp,
    check_demo,
    check_memory,
)
from benchmarks.gpu_check_train import check_train_modes  # noqa: E402
from capsmed.models import create_model, list_models  # noqa: E402
from capsmed.train.bench import PAPER_SETTINGS, bench_train  # noqa: E402
from capsmed.train.optim import build_optimizer  # noqa: E402
from capsmed.train.step import (  # noqa: E402
    StepSettings,
    TrainStep,
    float32_matmuls,
    resolve_precision,
)

PARTS = ("correctness", "train-modes", "demo", "ddp", "speed", "memory", "concurrent")
FORWARD_TOLERANCE = 1e-3  # fp32 with TF32 off: cuDNN/cuBLAS reorder sums, nothing more
SPEED_ARCHS = ("capsnet", "parallel-dr", "em-capsnet", "lenet", "baseline", "convnet-avg",
               "resnext50", "parallel-em")
MODES = ("eager-fp32", "eager-bf16", "compiled-bf16", "graph-bf16")
# Batch sizes per input size: 28 px sets are small images (large batches pay), the
# 400 px parallel networks are paper 001's AML setting (its batch: 15).
BATCHES = {28: (256, 1024, 4096), 400: (16, 64)}
TRAIN_STEPS = 20
TRAIN_LR = 1e-4  # paper 000's rate for medical sets; 1e-3 saturates aff-capsnet


class Report:
    """Appends Markdown sections and JSON lines to OUT as each part finishes."""

    def __init__(self, out: Path, device: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.md, self.jsonl = out / "gpu_check.md", out / "gpu_check.jsonl"
        self.failures: list[str] = []
        self.md.write_text(f"# capsmed GPU check\n\ndevice: {device}; torch {torch.__version__}"
                           f"; {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC\n\n"
                           f"command: {' '.join(['python3', *sys.argv])}\n", encoding="utf-8")
        self.jsonl.write_text("", encoding="utf-8")

    def record(self, part: str, **fields: Any) -> None:
        with self.jsonl.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"part": part, **fields}, default=str) + "\n")
        if fields.get("ok") is False:
            self.failures.append(f"{part}: {fields.get('name', '')} {fields.get('detail', '')}")

    def section(self, title: str, header: list[str], rows: list[list[Any]],
                note: str = "") -> None:
        lines = [f"\n## {title}\n", *( [note + "\n"] if note else []),
                 "| " + " | ".join(header) + " |",
                 "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        with self.md.open("a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


def arch_setting(arch: str, quick: bool) -> tuple[int, int, int, dict[str, Any]]:
    """(channels, side, classes, model kwargs): the paper's, or toy size with --quick."""
    c, side, k = PAPER_SETTINGS.get(arch, (1, 28, 10))
    if not quick:
        return c, side, k, {}
    from tests.helpers import TINY  # the test suite's toy widths, one place

    return c, 32 if side > 40 else side, k, dict(TINY.get(arch, {}))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_forward(arch: str, dev: torch.device, quick: bool) -> tuple[float, bool]:
    c, side, k, kw = arch_setting(arch, quick)
    torch.manual_seed(0)
    cpu_model = create_model(arch, in_channels=c, num_classes=k, input_size=side, **kw).eval()
    dev_model = copy.deepcopy(cpu_model).to(dev)
    x = torch.rand(2, c, side, side)
    with torch.no_grad(), float32_matmuls("fp32"):  # the CPU has no TF32
        ref = cpu_model(x).scores
        got = dev_model(x.to(dev)).scores
    err = relative_error(got, ref)
    return err, err <= FORWARD_TOLERANCE and bool(torch.isfinite(got).all())


def check_training(arch: str, dev: torch.device, precision: str, quick: bool
                   ) -> dict[str, Any]:
    """20 steps on one fixed batch: finite losses that go down; no host sync (CUDA)."""
    c, side, k, kw = arch_setting(arch, quick)
    torch.manual_seed(0)
    model = create_model(arch, in_channels=c, num_classes=k, input_size=side, **kw).to(dev)
    cl = dev.type == "cuda"
    if cl:
        model = model.to(memory_format=torch.channels_last)
    settings = StepSettings(loss_kind=model.loss_kind, recon_weight=5e-4,
                            autocast_dtype=resolve_precision(precision, dev), channels_last=cl)
    step = TrainStep(model, build_optimizer("adam", model.parameters(), TRAIN_LR), settings)
    batch = 8 if side <= 40 else 4
    x = torch.rand(batch, c, side, side, device=dev)
    y = torch.arange(batch, device=dev) % k
    steps = 5 if quick else TRAIN_STEPS
    losses, sync_error = [], ""
    with float32_matmuls(precision):  # fp32: IEEE fp32, as capsmed train runs it
        for i in range(steps):
            watch = dev.type == "cuda" and i >= 3  # after warm-up (lazy state, compiles)
            if watch:
                torch.cuda.set_sync_debug_mode("error")
            try:
                losses.append(step(x, y)[0])
            except RuntimeError as exc:
                if not watch:
                    raise
                sync_error = str(exc).splitlines()[0][:160]
                torch.cuda.set_sync_debug_mode("default")
                losses.append(step(x, y)[0])
            finally:
                if watch:
                    torch.cuda.set_sync_debug_mode("default")
    values = torch.stack(losses).float().cpu().tolist()
    finite = all(v == v and abs(v) != float("inf") for v in values)
    down = finite and sum(values[-3:]) / 3 < values[0]
    return {"first_loss": round(values[0], 5), "last_loss": round(values[-1], 5),
            "finite": finite, "decreases": down, "no_sync": not sync_error,
            "sync_error": sync_error, "ok": finite and down and not sync_error}


def part_correctness(report: Report, dev: torch.device, quick: bool) -> None:
    rows = []
    precisions = ("fp32", "bf16") if dev.type == "cpu" else ("fp32", "bf16", "fp16")
    for entry in list_models():
        torch._dynamo.reset()  # compiled routing: a fresh cache per architecture
        try:
            err, fwd_ok = check_forward(entry.name, dev, quick)
        except Exception as exc:
            err, fwd_ok = float("nan"), False
            report.record("correctness", name=entry.name, check="forward", ok=False,
                          detail=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        else:
            report.record("correctness", name=entry.name, check="forward", rel_error=err,
                          tolerance=FORWARD_TOLERANCE, ok=fwd_ok)
        cells = [entry.name, f"{err:.1e} {'ok' if fwd_ok else 'FAIL'}"]
        for precision in precisions:
            try:
                r = check_training(entry.name, dev, precision, quick)
            except Exception as exc:
                detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                report.record("correctness", name=entry.name, check=f"train-{precision}",
                              ok=False, detail=detail)
                cells.append("FAIL (error)")
                continue
            report.record("correctness", name=entry.name, check=f"train-{precision}", **r,
                          detail=r["sync_error"])
            cells.append(f"{r['first_loss']:.3g} -> {r['last_loss']:.3g} "
                         + ("ok" if r["ok"] else "FAIL" + ("" if r["no_sync"] else " (sync)")))
        rows.append(cells)
    report.section("Correctness", ["arch", "fwd vs CPU", *[f"train {p}" for p in precisions]],
                   rows, note=f"Forward: relative L2 difference of the class scores, device "
                   f"fp32 vs CPU fp32, same weights and inputs, TF32 off (tolerance "
                   f"{FORWARD_TOLERANCE:g}). Training: loss at step 1 -> step "
                   f"{5 if quick else TRAIN_STEPS} on one fixed batch; 'ok' = every loss "
                   "finite, the last three below the first, and (CUDA) no host-device "
                   "sync in steps 4 onwards.")


def batch_sizes(arch: str, quick: bool) -> tuple[int, ...]:
    _, side, _, _ = arch_setting(arch, quick)
    return (4,) if quick else BATCHES.get(side, BATCHES[28] if side <= 40 else BATCHES[400])


def speed_schedule(archs: list[str], quick: bool, first: int = 1
                   ) -> list[tuple[str, str, int]]:
    """The speed cells in the order they are timed: (arch, mode, batch), with a
    ("reference", "", batch) entry after capsnet's last cell at each batch.
    ``first`` (1-based) skips each architecture's smaller batches, to go on from an
    invocation whose budget ran out.

    Breadth first, so a time budget (``--budget-s``) cuts the least informative cells:
    every architecture's eager cells at its first batch, then its compiled and graph
    cells at that batch, and only then the second batch of each, and so on."""
    sizes = {arch: batch_sizes(arch, quick) for arch in archs}
    plan: list[tuple[str, str, int]] = []
    for i in range(first - 1, max((len(s) for s in sizes.values()), default=0)):
        for tier in (MODES[:2], MODES[2:]):
            for arch in (a for a in archs if i < len(sizes[a])):
                bs = sizes[arch][i]
                plan += [(arch, mode, bs) for mode in tier]
                if arch == "capsnet" and tier == MODES[2:]:
                    plan.append(("reference", "", bs))
    return plan


def bench_cell(arch: str, mode: str, bs: int, dev: torch.device, quick: bool
               ) -> dict[str, Any]:
    c, side, k, kw = arch_setting(arch, quick)
    kind, precision = mode.split("-")
    if kind != "eager" and dev.type != "cuda":
        return {"skipped": "CUDA only"}
    # A compiled kernel per batch size (not one for any size), as a fixed-size run gets;
    # a fresh cache per cell keeps the shapes under dynamo's recompile limit.
    torch._dynamo.reset()
    try:
        r = bench_train(arch, batch_size=bs, device=str(dev), precision=precision,
                        steps=2 if quick else TRAIN_STEPS, warmup=1 if quick else 5,
                        compile_model=kind == "compiled", cuda_graph=kind == "graph",
                        channels=c, input_size=side, num_classes=k, model_kwargs=kw)
    except torch.OutOfMemoryError:
        return {"skipped": "out of memory"}
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {"train_images_per_s": r.train_images_per_s, "eval_images_per_s":
            r.eval_images_per_s, "peak_memory_mib": r.peak_memory_mib,
            "parameters": r.parameters, "input": r.input}


def part_speed(report: Report, dev: torch.device, quick: bool, archs: list[str],
               deadline: float, first: int = 1) -> None:
    plan = speed_schedule(archs, quick, first)
    rows, best, references = [], {}, []
    dynamic = torch._dynamo.config.automatic_dynamic_shapes
    torch._dynamo.config.automatic_dynamic_shapes = False
    try:  # restored even when a cell crashes the part: later parts run after it
        for arch, mode, bs in plan:
            if arch == "reference":  # the textbook yardstick, right after capsnet's cells
                if ("capsnet", bs) in best and time.monotonic() <= deadline:
                    references.append(reference_ratio(report, dev, quick, bs, best))
                continue
            if time.monotonic() > deadline:
                cell = {"skipped": "time budget (--budget-s)"}
            else:
                cell = bench_cell(arch, mode, bs, dev, quick)
            report.record("speed", arch=arch, mode=mode, batch_size=bs, **cell)
            order = (archs.index(arch), MODES.index(mode), bs)
            if "skipped" in cell:
                rows.append((order, [arch, mode, bs, "-", "-", "-", cell["skipped"]]))
                continue
            best[(arch, bs)] = max(best.get((arch, bs), 0.0), cell["train_images_per_s"])
            rows.append((order, [arch, mode, bs, f"{cell['train_images_per_s']:,.0f}",
                                 f"{cell['eval_images_per_s']:,.0f}",
                                 f"{cell['peak_memory_mib']:,.0f}", ""]))
    finally:
        torch._dynamo.config.automatic_dynamic_shapes = dynamic
    report.section("Training throughput (capsmed bench train)",
                   ["arch", "mode", "batch", "train img/s", "eval img/s", "peak MiB", "note"],
                   [row for _, row in sorted(rows, key=lambda r: r[0])],
                   note=("Toy widths and sizes (--quick)" if quick else "Paper input sizes")
                   + "; random uint8 images held on the device; fp32 is IEEE fp32 (TF32 "
                   "off); "
                   f"{2 if quick else TRAIN_STEPS} timed steps after warm-up; peak = "
                   + ("max_memory_allocated." if dev.type == "cuda" else "process RSS.")
                   + " Cells are timed breadth first (every architecture's first batch "
                   "before any second one), so a time budget skips the larger batches.")
    if "capsnet" not in archs:
        return
    ref_rows = [[bs, f"{ref:,.0f}", f"{best[('capsnet', bs)]:,.0f}", f"{ratio:.2f}x"]
                for bs, ref, ratio in references]
    report.section("capsnet against a textbook eager fp32 CapsNet (same process)",
                   ["batch", "textbook img/s", "capsmed best img/s", "speed-up"], ref_rows,
                   note="The textbook model is reference_capsnet.py (paper size)"
                   + (": --quick times a toy capsmed model, so no speed-up is shown by "
                      "this ratio." if quick else "; capsmed's best mode at each batch."))


def reference_ratio(report: Report, dev: torch.device, quick: bool, bs: int,
                    best: dict[tuple[str, int], float]) -> tuple[int, float, float]:
    """The textbook CapsNet's img/s at batch ``bs``, and capsmed's best / it."""
    from benchmarks.reference_capsnet import time_reference

    with float32_matmuls("fp32"):  # IEEE fp32, as its name says
        ref = time_reference(bs, dev, steps=2 if quick else TRAIN_STEPS,
                             warmup=1 if quick else 5)
    ratio = best[("capsnet", bs)] / ref
    report.record("reference", batch_size=bs, reference_images_per_s=round(ref, 1),
                  capsmed_best_images_per_s=best[("capsnet", bs)], ratio=round(ratio, 2))
    return bs, ref, ratio


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                    help="folder for gpu_check.md and gpu_check.jsonl [benchmarks/results]")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:1, or cpu")
    ap.add_argument("--quick", action="store_true",
                    help="toy model sizes and few steps: exercise every code path")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--archs", default=",".join(SPEED_ARCHS),
                    help="architectures timed by the speed part")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the demo data and runs [a temporary one, removed]")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="stop starting new speed cells after this many seconds (cells run "
                    "breadth first: every arch's first batch before any second batch)")
    ap.add_argument("--from-batch", type=int, default=1, metavar="N",
                    help="time only each architecture's N-th batch size and larger ones "
                    "(to go on where a budget stopped an earlier invocation) [1]")
    args = ap.parse_args(argv)
    if args.from_batch < 1:
        ap.error("--from-batch counts from 1")
    started = time.monotonic()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; run with --device cpu --quick to exercise the "
              "check on a CPU", file=sys.stderr)
        return 1
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(f"error: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}",
              file=sys.stderr)
        return 1
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    if "speed" in parts and not speed_schedule(archs, args.quick, args.from_batch):
        print(f"error: --from-batch {args.from_batch}: none of {', '.join(archs)} has that "
              "many batch sizes", file=sys.stderr)
        return 1
    from capsmed.device import device_name

    report = Report(args.out, device_name(dev))
    work = args.work or Path(tempfile.mkdtemp(prefix="capsmed-gpu-check-"))
    runners: dict[str, Callable[[], None]] = {
        "correctness": lambda: part_correctness(report, dev, args.quick),
        "train-modes": lambda: check_train_modes(report, dev, args.quick, work),
        "demo": lambda: check_demo(report, dev, args.quick, work),
        "ddp": lambda: check_ddp(report, dev, args.quick, work),
        "speed": lambda: part_speed(report, dev, args.quick, archs,
                                    started + args.budget_s, args.from_batch),
        "memory": lambda: check_memory(report, dev, args.quick),
        "concurrent": lambda: check_concurrent(report, dev, args.quick, work),
    }
    for part in parts:
        t0 = time.monotonic()
        print(f"--- {part}", flush=True)
        try:
            runners[part]()
        except Exception as exc:  # report it and go on with the other parts
            traceback.print_exc()
            report.record(part, name="crashed", ok=False,
                          detail=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        print(f"--- {part} done in {time.monotonic() - t0:.0f} s", flush=True)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    summary = ("all checks passed" if not report.failures else
               f"{len(report.failures)} check(s) FAILED:\n  " + "\n  ".join(report.failures))
    with report.md.open("a", encoding="utf-8") as fh:
        fh.write(f"\n{summary}; {time.monotonic() - started:.0f} s in all\n")
    print(f"{summary}\nwritten: {report.md}, {report.jsonl}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
