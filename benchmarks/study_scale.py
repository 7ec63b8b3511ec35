"""How ``capsmed run`` scales to a 10,000-run study: dry run, status, and the rerun that
finds every run finished and writes the report.

The study is generated: one small dataset file (synthetic TUPAC16, made by ``capsmed
synth`` + ``preprocess``), one real run trained and evaluated on it (LeNet, one
epoch), and a grid of ``fraction x augment x seed`` (100 x 2 x 50 = 10,000 runs: paper
000's data conditions at scale, 50 repetitions each) whose run folders are copies of
that run (hard links) with each run's own options written into its ``config.yaml``,
so every file a command reads is a real capsmed file.
Then each command is timed as a user runs it, in a fresh process:

    PYTHONPATH=. python benchmarks/study_scale.py --workdir /tmp/scale [--runs 10000]

Prints one line per command (seconds) and writes ``WORKDIR/timings.json``.
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

FRACTIONS = [round(0.01 * i, 2) for i in range(1, 101)]
AUGMENT = [False, True]


def capsmed(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capsmed", *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


def make_data(work: Path) -> Path:
    data = work / "data" / "tupac16.h5"
    if data.is_file():
        return data
    raw = work / "raw"
    for argv in (["synth", "tupac16", str(raw), "--cases", "6", "--images-per-case", "1",
                  "--size", "256", "--seed", "0"],
                 ["preprocess", "tupac16", str(raw), "-o", str(data), "--workers", "1",
                  "--positives-per-mitosis", "2", "--seed", "0"]):
        proc = capsmed(*argv)
        if proc.returncode:
            raise SystemExit(proc.stderr)
    return data


def pipeline_file(work: Path, data: Path, seeds: int) -> Path:
    raw = {"name": "scale", "variables": {"out": str(work / "out")},
           "datasets": {"tupac16": {"output": str(data), "commands": []}},
           "grid": [{"dataset": ["tupac16"], "arch": ["lenet"], "fraction": FRACTIONS,
                     "augment": AUGMENT, "seed": list(range(seeds))}],
           "train": {"epochs": 1, "batch_size": 16, "device": "cpu"},
           "evaluate": [{"name": "report", "split": "test"}],
           "report": {"metric": "macro_f1", "tables": [
               {"title": "Macro F1 by training fraction", "rows": "fraction",
                "columns": "augment"},
               {"title": "Accuracy by training fraction", "rows": "fraction",
                "columns": "augment", "metric": "accuracy"}]}}
    path = work / "scale.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def template_run(work: Path, data: Path) -> Path:
    run = work / "template"
    if (run / "report" / "report.json").is_file():
        return run
    for argv in (["train", "--data", str(data), "--arch", "lenet", "--epochs", "1",
                  "--batch-size", "16", "--device", "cpu", "--out", str(run)],
                 ["evaluate", str(run), "--no-grids"]):
        proc = capsmed(*argv)
        if proc.returncode:
            raise SystemExit(proc.stderr)
    return run


def fill(pipeline_path: Path, template: Path) -> int:
    """Every run's folder, finished: the template's files (hard links), its own
    config.yaml, and what its job writes as it ends (verified.jsonl, the study index)."""
    from capsmed.pipeline.identity import run_identity
    from capsmed.pipeline.spec import load_pipeline
    from capsmed.pipeline.state import PipelineState

    pipeline = load_pipeline(pipeline_path)
    state = PipelineState(pipeline.out).keep_digests()
    config = yaml.safe_load((template / "config.yaml").read_text())
    verified = []
    for run in pipeline.runs:
        run_dir = state.run_dir(run, run_identity(run))
        if not (run_dir / "report" / "report.json").is_file():
            shutil.copytree(template, run_dir, copy_function=os.link, dirs_exist_ok=True)
            (run_dir / "config.yaml").unlink()  # a link: write this run's own
            config["train"].update(run.train)
            (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        st = (run_dir / "checkpoint.safetensors").stat()
        verified.append(json.dumps({"run": str(run_dir),
                                    "stat": [st.st_size, st.st_mtime_ns, st.st_ino]}))
        state.index().evaluated(run_dir, "report")  # what the run's job adds as it ends
    (state.records / "verified.jsonl").write_text("\n".join(verified) + "\n")
    state.index().save()
    return len(pipeline.runs)


def timed(label: str, *args: str, expect: int = 0) -> float:
    started = time.perf_counter()
    proc = capsmed(*args)
    seconds = time.perf_counter() - started
    if proc.returncode != expect:
        raise SystemExit(f"{label}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    print(f"{label}: {seconds:.1f} s")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=10000,
                        help="grid size (a multiple of 200)")
    args = parser.parse_args()
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    data = make_data(work)
    path = pipeline_file(work, data, args.runs // (len(FRACTIONS) * len(AUGMENT)))
    runs = fill(path, template_run(work, data))
    out = {"runs": runs, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
           "python": platform.python_version(),
           "command": " ".join(["PYTHONPATH=. python", "benchmarks/study_scale.py",
                                *sys.argv[1:]])}
    out["dry_run_s"] = timed("capsmed run --dry-run", "run", "--dry-run", str(path))
    out["status_s"] = timed("capsmed run status", "run", "status", str(path))
    out["status_list_s"] = timed("capsmed run status --list", "run", "status", str(path),
                                 "--list")
    out["rerun_with_report_s"] = timed("capsmed run (all finished: the report)", "run",
                                       str(path))
    (work / "timings.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
