"""A whole study's throughput, not a benchmark step: K runs of each of paper 000's
three architectures (capsnet, lenet, baseline) through ``capsmed run``, on synthetic
data of MNIST's size, at the paper's batch (128), with validation and evaluation.

Reports, per architecture: the steady training rate (training images per second of
the epochs after the first, their validation included), the first epoch's extra
seconds (compilation, CUDA-graph capture, cuDNN's search: paid once per run), the
device-busy fraction (the runs' epoch seconds over the study's wall time), the
seconds per run outside its epochs (start-up, data loading, evaluation, saving) and
the checkpoint writes' share of them; then the GPU-hours of paper 000's whole
432-run study (``pipelines/jimenez2018.yaml``: 50 epochs, its declared split sizes)
extrapolated from those figures: per run, its epochs at the steady rate, plus the
first epoch's extra and the seconds outside epochs.

    PYTHONPATH=. python benchmarks/study_throughput.py --workdir /tmp/st --device cuda
    PYTHONPATH=. python benchmarks/study_throughput.py --workdir /tmp/st --toy

``--mode ARCH=MODE`` trains one architecture in its own mode (``eager``, ``compile``,
``graph`` or ``compile+graph``; the others follow ``--compile``/``--cuda-graph``),
so the extrapolation can use each architecture's fastest mode. Given twice for one
architecture (``--mode capsnet=compile+graph --mode capsnet=eager``), K runs are
trained in each mode, and each of the study's runs is counted at the rate of the mode
it trains in (with ``--set gpu_modes=true``: capsnet compiled and graphed, lenet
graphed). A ``MODE+augment`` mode trains with paper 000's medical augmentation on the
device, and only such a figure counts the study's augmented runs (the medical sets'
and the digit sets' `aug` condition: half of them).
``--toy`` (the test suite's size: 256 images, reduced widths, CPU) checks the script,
not the speed. ``--fresh-processes`` runs every command in its own process (the
behaviour before capsmed run's worker), for a side-by-side figure.
``--runs-per-gpu K`` lets K runs share the GPU (``capsmed run --runs-per-gpu``): each
architecture then runs alone, its runs K at a time, and the extrapolation keeps K of
its runs in flight (each run's time at the rate it had while sharing, over K; its
first K runs, one per worker, with the first run's warm-up). Writes
``WORKDIR/study_throughput.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("capsnet", "lenet", "baseline")
TOY_WIDTHS = {  # reduced widths (--toy): seconds on a CPU
    "capsnet": {"conv_channels": 16, "primary_types": 4, "primary_dim": 4, "class_dim": 8},
    "baseline": {"channels": [8, 8, 8], "hidden": [32, 16]},
}
PAPER_STUDY = ROOT / "pipelines" / "jimenez2018.yaml"
SPEED_MODES = {"eager": {}, "compile": {"compile": True}, "graph": {"cuda_graph": True},
               "compile+graph": {"compile": True, "cuda_graph": True}}
# each also with paper 000's medical augmentation on the device (``MODE+augment``): half
# of jimenez2018's runs train augmented (the medical sets' and the digit sets' `aug`),
# and their draws, made before each step outside any graph, cost launches of their own
MODES = SPEED_MODES | {f"{name}+augment": {**options, "augment": True,
                                           "augment_recipe": "paper000-medical"}
                       for name, options in SPEED_MODES.items()}


def capsmed(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "capsmed", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})
    if proc.returncode:
        raise SystemExit(f"capsmed {' '.join(args)}: exit {proc.returncode}\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def make_data(work: Path, train: int, val: int, test: int) -> Path:
    data = work / "data" / f"mnist-{train}.h5"
    if not data.is_file():
        raw = work / f"raw-{train}"
        shutil.rmtree(raw, ignore_errors=True)
        capsmed("synth", "mnist", str(raw), "--train", str(train + val), "--test",
                str(test), "--seed", "0")
        capsmed("preprocess", "mnist", str(raw), "-o", str(data), "--val", str(val),
                "--seed", "0")
    return data


def pipeline_file(work: Path, data: Path, args: argparse.Namespace) -> Path:
    """The study: K runs of each architecture (of each of its modes, given several)."""
    several = [a for a in args.archs if len(args.mode.get(a, [])) > 1]
    single = [a for a in args.archs if a not in several]
    train = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": 1.0e-3,
             "device": args.device, "precision": args.precision, "patience": None}
    train |= {"compile": True} if args.compile else {}
    train |= {"cuda_graph": True} if args.cuda_graph else {}
    raw = {"name": "throughput", "variables": {"out": str(work / "out")},
           "datasets": {"mnist": {"output": str(data), "commands": []}},
           "grid": [{"dataset": ["mnist"], "arch": single,
                     "seed": list(range(args.runs))}] * bool(single)
                   # a mode is not part of a run's identity: other seeds for each mode
                   + [{"dataset": ["mnist"], "arch": [arch], "mode": [mode],
                       "seed": list(range(i * args.runs, (i + 1) * args.runs))}
                      for arch in several for i, mode in enumerate(args.mode[arch])],
           "train": train,
           "rules": [{"when": {"arch": arch}, "set": {"model_kwargs": widths}}
                     for arch, widths in TOY_WIDTHS.items()
                     if args.toy and arch in args.archs]
                    + [{"when": {"arch": arch, **({"mode": mode} if arch in several else {})},
                        "set": {"compile": False, "cuda_graph": False, **MODES[mode]}}
                       for arch, modes in args.mode.items() if arch in args.archs
                       for mode in modes],
           "evaluate": [{"name": "report", "split": "test"}],
           "report": {"metric": "accuracy", "tables": [
               {"title": "Accuracy", "rows": "seed", "columns": "arch"}]}}
    local = {"worker": False} if args.fresh_processes else {}
    local |= {"runs_per_gpu": args.runs_per_gpu} if args.runs_per_gpu > 1 else {}
    if local:
        raw["executor"] = {"local": local}
    path = work / "throughput.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def write_seconds(path: Path, repeats: int = 3) -> float:
    """Seconds to write this checkpoint again (read, then written as training does)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    copy = path.with_name("rewrite.safetensors")
    started = time.perf_counter()
    for _ in range(repeats):
        save_file(tensors, str(copy))
        os.sync()
    copy.unlink()
    return (time.perf_counter() - started) / repeats


def run_figures(out: Path) -> list[dict]:
    """Per run: its wall time (from the runner's record), epoch seconds, images."""
    rows = []
    for record_path in sorted((out / ".capsmed-run" / "runs").glob("*.json")):
        record = json.loads(record_path.read_text())
        run_dir = next((out / "runs").glob(f"{record['label']}-*"))
        epochs = [json.loads(line) for line in
                  (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        summary = json.loads((run_dir / "summary.json").read_text())
        config = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]
        checkpoint = run_dir / "checkpoint.safetensors"
        rows.append({
            "arch": record["fields"]["arch"],
            "mode": run_mode(config),
            "started": record["started"],
            "wall_s": record["updated"] - record["started"],
            "epoch_s": sum(e["seconds"] for e in epochs),
            "epoch_seconds": [e["seconds"] for e in epochs],
            "epochs": len(epochs),
            "train_samples": summary["train_samples"],
            "train_images": summary["train_samples"] * len(epochs),
            "checkpoint_writes": sum(bool(e.get("best")) for e in epochs),
            "checkpoint_write_s": write_seconds(checkpoint),
            "batch_size": config["batch_size"],
        })
    return rows


def per_arch(rows: list[dict], walls: dict[str, float], share: int = 1
             ) -> dict[str, dict]:
    """Per architecture: the steady rate of one run, and the seconds each run spends
    beyond its epochs at that rate (the first epoch's extra and the time outside
    epochs), split into the first runs' (the first ``share`` runs: one per worker;
    compilation and CUDA-graph capture are kept for the runs after them) and a later
    run's. ``walls``: the study's wall seconds, or each architecture's when they ran
    one after another (``share`` > 1)."""
    out = {}
    groups = sorted({(r["arch"], r["mode"]) for r in rows})
    for arch, mode in groups:
        # an architecture measured in several modes: one figure per mode
        key = arch if sum(a == arch for a, _ in groups) == 1 else f"{arch} {mode}"
        mine = sorted((r for r in rows if (r["arch"], r["mode"]) == (arch, mode)),
                      key=lambda r: r["started"])
        epoch_s = sum(r["epoch_s"] for r in mine)
        # steady: the epochs after each run's first (all of them if a run has one)
        later = [(r["train_samples"], s) for r in mine for s in r["epoch_seconds"][1:]]
        later = later or [(r["train_samples"], s) for r in mine for s in r["epoch_seconds"]]
        steady = sum(n for n, _ in later) / sum(s for _, s in later)
        for r in mine:
            r["first_epoch_extra_s"] = max(0.0, r["epoch_seconds"][0]
                                           - r["train_samples"] / steady)
            r["overhead_s"] = r["first_epoch_extra_s"] + r["wall_s"] - r["epoch_s"]
        first, rest = mine[:share], mine[share:] or mine[:share]  # no later run: as first
        wall = walls.get(key, walls.get("*", 0.0))
        out[key] = {
            "arch": arch,
            "runs": len(mine),
            "runs_per_gpu": share,
            "mode": mode,
            "images_per_s": steady,
            "images_per_s_all_epochs": sum(r["train_images"] for r in mine) / epoch_s,
            "first_epoch_extra_s": sum(r["first_epoch_extra_s"] for r in mine) / len(mine),
            "epoch_s_per_run": epoch_s / len(mine),
            "outside_epochs_s_per_run": sum(r["wall_s"] - r["epoch_s"] for r in mine)
            / len(mine),
            "first_run_overhead_s": sum(r["overhead_s"] for r in first) / len(first),
            "later_run_overhead_s": sum(r["overhead_s"] for r in rest) / len(rest),
            "checkpoint_s_per_run": sum(r["checkpoint_writes"] * r["checkpoint_write_s"]
                                        for r in mine) / len(mine),
            # the runs' epoch seconds over the GPU's wall seconds x runs sharing it
            "busy_share_of_study": epoch_s / (wall * share),
            "per_run": [{k: r[k] for k in ("wall_s", "epoch_seconds", "overhead_s")}
                        for r in mine],
        }
    return out


def run_mode(train: dict) -> str:
    """A run's mode from its options: eager, compile, graph or compile+graph, with
    ``+augment`` when it augments on the device."""
    speed = "+".join(m for m in ("compile", "graph") if train.get(
        {"graph": "cuda_graph"}.get(m, m))) or "eager"
    return f"{speed}+augment" if train.get("augment") else speed


def paper_study_hours(figures: dict[str, dict]) -> tuple[float, int, int]:
    """GPU-hours of jimenez2018's runs at these rates (each run: its epochs x its
    training images per epoch / the steady rate, plus a later run's overhead; each
    figure's first runs, one per worker sharing the GPU, the first run's overhead
    instead), and how many of its runs that covers. A run is counted at the figure of
    its architecture in the mode the study trains it in: with ``--set gpu_modes=true``
    its GPU mode where one was measured, else its own (eager), and augmented or not as
    the run is (an augmented run only at a ``+augment`` figure: half of the study).
    ``figures``: keyed by architecture, or ``"ARCH MODE"`` (each names its ``arch``
    and ``mode``; eager when not said)."""
    from capsmed.pipeline.estimate import data_shape, training_images
    from capsmed.pipeline.spec import load_pipeline

    pipeline = load_pipeline(PAPER_STUDY)
    gpu_modes = {r.label: run_mode(r.train)
                 for r in load_pipeline(PAPER_STUDY, {"gpu_modes": True}).runs}
    by_mode = {(f.get("arch", key.split()[0]), f.get("mode", "eager")): key
               for key, f in figures.items()}
    seconds, covered, seen = 0.0, 0, dict.fromkeys(figures, 0)
    for run in pipeline.runs:
        arch = run.train.get("arch")
        key = next((by_mode[arch, m] for m in (gpu_modes[run.label], run_mode(run.train))
                    if (arch, m) in by_mode), None)
        shape = data_shape(pipeline, run)
        images = training_images(run, (shape or {}).get("splits") or {})
        if key is None or images is None:
            continue
        fig = figures[key]
        # K workers each pay the first run's warm-up (compilation, graph capture) once
        overhead = fig["later_run_overhead_s"] if seen[key] >= fig.get(
            "runs_per_gpu", 1) else fig["first_run_overhead_s"]
        seen[key] += 1
        run_s = int(run.train.get("epochs", 50)) * images / fig["images_per_s"] + overhead
        seconds += run_s / fig.get("runs_per_gpu", 1)  # K of its runs in flight at once
        covered += 1
    return seconds / 3600, covered, len(pipeline.runs)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    parser.add_argument("--runs", type=int, default=2, help="runs (seeds) per arch")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per run (the first is warm-up; 2 or more)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--cuda-graph", action="store_true")
    parser.add_argument("--mode", action="append", default=[], metavar="ARCH=MODE",
                        help=f"one architecture's mode: {', '.join(MODES)}")
    parser.add_argument("--fresh-processes", action="store_true")
    parser.add_argument("--runs-per-gpu", type=int, default=1, metavar="K",
                        help="runs sharing the GPU at once; each architecture then runs "
                        "alone, K runs at a time")
    parser.add_argument("--toy", action="store_true", help="256 images, reduced widths, "
                        "CPU: checks the script, not the speed")
    args = parser.parse_args(argv)
    pairs = [m.partition("=") for m in args.mode]
    bad = [f"{a}{eq}{m}" for a, eq, m in pairs if not eq or m not in MODES or a not in ARCHS]
    if bad:
        parser.error(f"--mode {bad[0]}: give ARCH=MODE, ARCH one of {', '.join(ARCHS)}, "
                     f"MODE one of {', '.join(MODES)}")
    absent = [f"{a}={m}" for a, _, m in pairs if a not in args.archs]
    if absent:  # it trained nothing, yet the record listed it among the modes
        parser.error(f"--mode {absent[0]}: {absent[0].partition('=')[0]} is not among "
                     f"--archs ({' '.join(args.archs)})")
    args.mode = {}
    for a, _, m in pairs:  # an architecture may be given several modes
        if m not in args.mode.setdefault(a, []):
            args.mode[a].append(m)
    if args.epochs < 2:  # the steady rate is the epochs after the first (warm-up)
        parser.error(f"--epochs must be 2 or more, got {args.epochs}: the steady rate "
                     "is timed on the epochs after the first")
    if args.toy:
        args.device, args.batch_size = "cpu", 32
    sizes = (256, 64, 64) if args.toy else (55_000, 5_000, 10_000)
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    data = make_data(work, *sizes)
    path = pipeline_file(work, data, args)
    shutil.rmtree(work / "out", ignore_errors=True)
    if args.runs_per_gpu < 1:
        parser.error("--runs-per-gpu must be 1 or more")
    walls: dict[str, float] = {}
    started = time.perf_counter()
    if args.runs_per_gpu == 1:
        capsmed("run", str(path), "--no-report")
        walls["*"] = time.perf_counter() - started
    else:  # one architecture (and mode) at a time, so only its own runs share the GPU
        for arch in args.archs:
            modes = args.mode.get(arch, [])
            for mode in modes if len(modes) > 1 else [None]:
                began = time.perf_counter()
                capsmed("run", str(path), "--no-report", "--only",
                        f"arch={arch}" + (f",mode={mode}" if mode else ""))
                walls[arch if mode is None else f"{arch} {mode}"] = \
                    time.perf_counter() - began
    wall = time.perf_counter() - started
    figures = per_arch(run_figures(work / "out"), walls, args.runs_per_gpu)
    hours, covered, total = paper_study_hours(figures)
    result = {
        "command": " ".join(["PYTHONPATH=. python benchmarks/study_throughput.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "device": device_name(args.device), "toy": args.toy,
        "train_images": sizes[0], "val_images": sizes[1], "test_images": sizes[2],
        "epochs": args.epochs, "batch_size": args.batch_size,
        "precision": args.precision, "compile": args.compile,
        "cuda_graph": args.cuda_graph, "modes": args.mode,
        "fresh_processes": args.fresh_processes, "runs_per_gpu": args.runs_per_gpu,
        "study_wall_s": wall,
        "busy_fraction": sum(f["busy_share_of_study"] * walls.get(a, wall)
                             for a, f in figures.items()) / wall,
        "archs": figures,
        "paper000_gpu_hours": hours, "paper000_runs_covered": f"{covered} of {total}",
    }
    (work / "study_throughput.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    return result


def table(result: dict) -> str:
    lines = [f"{result['device']}: {result['study_wall_s']:.1f} s wall, device busy "
             f"{100 * result['busy_fraction']:.0f} %",
             f"{'arch':<9}{'mode':<14}{'img/s':>8}{'epochs s':>9}{'1st run':>9}"
             f"{'later':>8}{'ckpt s':>8}",
             "img/s: steady, after the first epoch; epochs s: per run; 1st run, later:",
             "a run's seconds beyond its epochs at that rate (warm-up, start-up,",
             "evaluation, saving); ckpt s: its checkpoint writes"]
    if result.get("runs_per_gpu", 1) > 1:
        lines.append(f"runs per GPU: {result['runs_per_gpu']}, each architecture alone; "
                     "img/s is one run's while they shared it")
    for key, f in result["archs"].items():
        lines.append(f"{f.get('arch', key):<9}{f['mode']:<14}{f['images_per_s']:>8.0f}"
                     f"{f['epoch_s_per_run']:>9.1f}{f['first_run_overhead_s']:>9.1f}"
                     f"{f['later_run_overhead_s']:>8.1f}"
                     f"{f['checkpoint_s_per_run']:>8.2f}")
    lines.append(f"paper 000's study at these rates: {result['paper000_gpu_hours']:.1f} "
                 f"h ({result['paper000_runs_covered']} runs)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
