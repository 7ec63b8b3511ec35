"""The parts of ``gpu_check.py`` that drive the CLI, torchrun and several processes.

Each part records its checks and figures through the report object ``gpu_check.py``
passes in (``record(part, **fields)``, ``section(title, header, rows, note)``).
Commands run as subprocesses of the same Python with the repository on
``PYTHONPATH``, so nothing needs installing on the GPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--model-arg", "conv_channels=16", "--model-arg", "primary_types=4",
             "--model-arg", "primary_dim=4", "--model-arg", "class_dim=8"]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
            "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}


def _run(cmd: list[str], timeout: float = 1800) -> tuple[bool, str]:
    """Run a command; (succeeded, the tail of its output)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout,
                          cwd=ROOT)
    tail = (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode == 0, tail


def _capsmed(*args: str) -> list[str]:
    return [sys.executable, "-m", "capsmed", *args]


def demo_data(work: Path, quick: bool) -> tuple[Path | None, str]:
    """Synthetic TUPAC16 (official layout) preprocessed to an .h5 under ``work``."""
    data = work / "demo" / "tupac16.h5"
    if data.is_file():
        return data, ""
    raw = work / "demo" / "raw"
    shutil.rmtree(work / "demo", ignore_errors=True)
    (work / "demo").mkdir(parents=True)
    ok, tail = _run(_capsmed("synth", "tupac16", str(raw), "--cases", "8" if quick else "14",
                             "--images-per-case", "2" if quick else "3"))
    if not ok:
        return None, "synth: " + tail
    ok, tail = _run(_capsmed("preprocess", "tupac16", str(raw), "-o", str(data),
                             "--positives-per-mitosis", "3" if quick else "8"))
    return (data, "") if ok else (None, "preprocess: " + tail)


def check_demo(report: Any, dev: torch.device, quick: bool, work: Path) -> None:
    """synth -> preprocess -> train -> evaluate through the CLI, on ``dev``."""
    data, problem = demo_data(work, quick)
    run_dir = work / "demo" / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    steps: list[tuple[str, list[str]]] = [
        ("train", _capsmed("train", "--data", str(data), "--arch", "capsnet", "--epochs",
                           "1" if quick else "8", "--batch-size", "32", "--lr", "1e-4",
                           "--recon-weight", "5e-5", "--device", str(dev), "--out",
                           str(run_dir), *(TINY_ARGS if quick else []))),
        ("evaluate", _capsmed("evaluate", str(run_dir), "--device", str(dev),
                              "--no-grids")),
    ]
    ok = data is not None
    for name, cmd in steps if ok else []:
        started = time.monotonic()
        ok, tail = _run(cmd)
        report.record("demo", name=name, ok=ok, seconds=round(time.monotonic() - started, 1),
                      detail="" if ok else tail[-500:])
        if not ok:
            problem = f"{name}: {tail}"
            break
    if data is None:
        report.record("demo", name="data", ok=False, detail=problem[-500:])
    table = run_dir / "report" / "report.md"
    text = table.read_text(encoding="utf-8") if ok and table.is_file() else problem
    text = "\n".join("##" + line if line.startswith("# ") else line  # under this heading
                     for line in text.splitlines())
    metrics = run_dir / "metrics.jsonl"
    speed = ""
    if ok and metrics.is_file():
        last = json.loads(metrics.read_text(encoding="utf-8").splitlines()[-1])
        speed = f" Last epoch: {last['images_per_s']:,.0f} training img/s."
    with report.md.open("a", encoding="utf-8") as fh:
        fh.write(f"\n## Demo chain on {dev} (synth -> preprocess -> train -> evaluate)\n\n"
                 f"{'passed' if ok else 'FAILED'}.{speed}\n\n{text.strip()}\n")
    print(f"demo chain: {'passed' if ok else 'FAILED'}{speed}", flush=True)


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [v for line in lines if line
            for v in (json.loads(line)["train_loss"], json.loads(line).get("val_loss"))
            if v is not None]


def check_ddp(report: Any, dev: torch.device, quick: bool, work: Path) -> None:
    """``torchrun --nproc-per-node N`` against the single-process loss curve."""
    data, problem = demo_data(work, quick)
    if data is None:
        report.record("ddp", name="data", ok=False, detail=problem[-500:])
        return
    base = ["train", "--data", str(data), "--arch", "capsnet", "--epochs", "2",
            "--batch-size", "32", "--precision", "fp32", "--seed", "0", "--augment",
            "--device", "cuda" if dev.type == "cuda" else "cpu",
            *(TINY_ARGS if quick else [])]
    single = work / "ddp" / "single"
    shutil.rmtree(work / "ddp", ignore_errors=True)
    ok, tail = _run(_capsmed(*base, "--out", str(single)))
    if not ok:
        report.record("ddp", name="single process", ok=False, detail=tail[-500:])
        return
    reference = _losses(single)
    rows = [["1 process (no torchrun)", "-", " ".join(f"{v:.5f}" for v in reference), "-"]]
    gpus = torch.cuda.device_count() if dev.type == "cuda" else 1
    for n in range(1, gpus + 1):
        out = work / "ddp" / f"nproc{n}"
        ok, tail = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", str(n), "-m", "capsmed", *base, "--out",
                         str(out)])
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if not ok:
            report.record("ddp", name=f"nproc {n}", ok=False, detail=tail[-500:])
            rows.append([f"torchrun nproc {n}", backend, "FAILED", "-"])
            continue
        got = _losses(out)
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, reference, strict=True))
        tolerance = 1e-5 if n == 1 else 2e-2  # N > 1 reduces gradients in another order
        report.record("ddp", name=f"nproc {n}", backend=backend, losses=got,
                      reference=reference, max_rel_diff=diff, tolerance=tolerance,
                      ok=diff <= tolerance)
        rows.append([f"torchrun nproc {n}", backend, " ".join(f"{v:.5f}" for v in got),
                     f"{diff:.1e} {'ok' if diff <= tolerance else 'FAIL'}"])
    report.section("torchrun against one process", ["run", "backend",
                   "train/val loss per epoch", "max rel. diff"], rows,
                   note="capsnet, 2 epochs, fp32, seed 0, --augment, global batch 32 on the demo "
                   "data. "
                   "Tolerance: 1e-5 for one process, 2e-2 for several.")


def peak_step_mib(arch: str, batch: int, side: int, dev: torch.device,
                  precision: str = "bf16", **model_kwargs: Any) -> float:
    """Peak device memory (MiB) of one training step; raises OutOfMemoryError."""
    from capsmed.train.bench import bench_train

    r = bench_train(arch, batch_size=batch, device=str(dev), steps=1, warmup=1,
                    precision=precision, input_size=side, model_kwargs=model_kwargs)
    return r.peak_memory_mib


def _fits(arch: str, batch: int, side: int, dev: torch.device) -> bool:
    try:
        peak_step_mib(arch, batch, side, dev)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        torch.cuda.empty_cache()


def largest_batch(arch: str, side: int, dev: torch.device, start: int, cap: int) -> int:
    """The largest batch whose training step fits (doubling, then 4 bisection steps)."""
    good, bad = 0, None
    batch = start
    while batch <= cap and _fits(arch, batch, side, dev):
        good, batch = batch, batch * 2
    bad = batch if batch <= cap else None
    for _ in range(4 if bad is not None else 0):
        mid = (good + bad) // 2
        if mid <= good:
            break
        good, bad = (mid, bad) if _fits(arch, mid, side, dev) else (good, mid)
    return good


MAX_BATCH_CASES = (("capsnet", 28, 4096, 1 << 17), ("capsnet", 40, 2048, 1 << 16),
                   ("em-capsnet", 28, 1024, 1 << 15), ("parallel-dr", 128, 32, 4096),
                   ("parallel-dr", 400, 8, 1024), ("parallel-em", 400, 8, 1024),
                   ("resnext50", 400, 16, 2048))


def check_memory(report: Any, dev: torch.device, quick: bool) -> None:
    """parallel-dr at 128 px / batch 15 within 24 GB; the largest batch per input size."""
    if dev.type != "cuda":
        peak_step_mib("capsnet", 2, 28, dev, precision="fp32", conv_channels=16,
                      primary_types=4)  # exercises the code path; CPU peaks are RSS
        report.record("memory", name="skipped", detail="device memory: CUDA only")
        return
    rows = []
    for precision in ("bf16", "fp32"):
        peak = peak_step_mib("parallel-dr", 15, 128, dev, precision=precision)
        ok = peak < 24 * 1024
        report.record("memory", name=f"parallel-dr 128px batch 15 {precision}",
                      peak_mib=peak, ok=ok)
        rows.append([f"parallel-dr 128 px, 12 branches, batch 15, {precision}",
                     f"{peak / 1024:.2f} GiB", "ok (< 24 GB)" if ok else "FAIL"])
    total = torch.cuda.get_device_properties(dev).total_memory / 2**30
    for arch, side, start, cap in MAX_BATCH_CASES[:1] if quick else MAX_BATCH_CASES:
        best = largest_batch(arch, side, dev, start, cap)
        report.record("memory", name=f"max batch {arch} {side}px", max_batch=best,
                      device_gib=round(total, 1))
        rows.append([f"{arch} {side} px, bf16: largest batch", f"{best:,}",
                     f"in {total:.0f} GiB" + (" (search cap)" if best >= cap else "")])
    report.section("Memory", ["case", "value", "note"], rows,
                   note="One training step (forward, backward, Adam), peak "
                   "max_memory_allocated; largest batch: doubling, then 4 bisection steps.")


def concurrent_worker(batch: int, steps: int, barrier: Path, n: int, device: str,
                      quick: bool) -> None:
    """One of ``n`` concurrent trainings: warm up, wait for the others, time ``steps``."""
    from capsmed.models import create_model
    from capsmed.train.optim import build_optimizer
    from capsmed.train.step import StepSettings, TrainStep, resolve_precision

    dev = torch.device(device)
    kwargs = {"conv_channels": 16, "primary_types": 4} if quick else {}
    model = create_model("capsnet", **kwargs).to(dev)
    settings = StepSettings(loss_kind="margin", recon_weight=5e-4,
                            autocast_dtype=resolve_precision("bf16", dev),
                            channels_last=dev.type == "cuda")
    step = TrainStep(model, build_optimizer("adam", model.parameters(), 1e-3), settings)
    x = torch.rand(batch, 1, 28, 28, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    for _ in range(5):
        step(x, y)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    (barrier / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 600
    while len(list(barrier.glob("ready-*"))) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    print(json.dumps({"images_per_s": steps * batch / (time.perf_counter() - started)}))


def check_concurrent(report: Any, dev: torch.device, quick: bool, work: Path) -> None:
    """N capsnet trainings at once on one device: per-run and summed img/s."""
    batch, steps = (4, 3) if quick else (1024, 200)
    rows = []
    for n in (1,) if quick else (1, 2, 4):
        barrier = work / "concurrent" / f"n{n}"
        shutil.rmtree(barrier, ignore_errors=True)
        barrier.mkdir(parents=True)
        procs = [subprocess.Popen([sys.executable, __file__, "--concurrent-worker", str(batch),
                                   str(steps), str(barrier), str(n), str(dev),
                                   "1" if quick else "0"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
                 for _ in range(n)]
        rates, errors = [], []
        for proc in procs:
            out, err = proc.communicate(timeout=1800)
            if proc.returncode == 0:
                rates.append(json.loads(out.strip().splitlines()[-1])["images_per_s"])
            else:
                errors.append(err[-300:])
        ok = not errors
        report.record("concurrent", name=f"{n} runs", runs=n, batch_size=batch,
                      images_per_s=rates, total=sum(rates), ok=ok, detail="; ".join(errors))
        rows.append([n, f"{min(rates, default=0):,.0f}" if ok else "FAILED",
                     f"{sum(rates):,.0f}" if ok else "-"])
    report.section("Concurrent capsnet trainings on one device", ["runs", "slowest run "
                   "img/s", "summed img/s"], rows,
                   note=f"capsnet (8.2M), bf16, batch {batch}, {steps} steps timed after all "
                   "runs warmed up; one process per run.")


if __name__ == "__main__" and sys.argv[1:2] == ["--concurrent-worker"]:
    sys.path.insert(0, str(ROOT))
    b, s, barrier_dir, count, device_arg, quick_flag = sys.argv[2:8]
    concurrent_worker(int(b), int(s), Path(barrier_dir), int(count), device_arg,
                      quick_flag == "1")
