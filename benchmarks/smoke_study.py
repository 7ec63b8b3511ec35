"""The smoke study's wall time beside the wall time of one ``capsmed train`` of one of
its runs, measured in one command on this machine (issue 22's CPU target: the study at
most 3x the one run).

    PYTHONPATH=. python benchmarks/smoke_study.py --workdir /tmp/smoke-bench

Runs ``--repeat`` times, alternated: ``capsmed run pipelines/smoke.yaml`` (data stage,
8 runs trained and evaluated, 2 analyses, the report) with capsmed run's worker, then
``capsmed train`` of the study's first capsnet run (its own config file) in a fresh
process, as a user types it; then once the study with every command in a fresh
process (``executor: {local: {worker: false}}``). Each from an empty output folder.
Prints the medians and the ratios, and writes ``WORKDIR/smoke_study.json`` with every
time and the load average before each pair.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "pipelines" / "smoke.yaml"


def timed(*args: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "capsmed", *args], capture_output=True,
                          text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"capsmed {' '.join(args)}: exit {proc.returncode}\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def study(work: Path, name: str, worker: bool) -> tuple[float, Path]:
    raw = yaml.safe_load(SMOKE.read_text())
    raw["variables"]["out"] = str(work / name)
    if not worker:
        raw["executor"] = {"local": {"worker": False}}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.rmtree(work / name, ignore_errors=True)
    return timed("run", str(path)), work / name


def first_capsnet_config(out: Path) -> Path:
    for config in sorted((out / ".capsmed-run" / "configs").glob("*.yaml")):
        if yaml.safe_load(config.read_text()).get("arch") == "capsnet":
            return config
    raise SystemExit(f"no capsnet run config under {out}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3,
                        help="study/train pairs, alternated (medians reported)")
    parser.add_argument("--no-fresh", action="store_true",
                        help="skip the (slow) study with a fresh process per command")
    args = parser.parse_args(argv)
    work = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    studies, trains, loads = [], [], []
    for _ in range(args.repeat):  # side by side: a busy spell hits both alike
        loads.append(os.getloadavg()[0])
        seconds, out = study(work, "with-worker", worker=True)
        studies.append(seconds)
        one_run = work / "one-run"
        shutil.rmtree(one_run, ignore_errors=True)
        trains.append(timed("train", "--config", str(first_capsnet_config(out)),
                            "--out", str(one_run)))
    fresh = None if args.no_fresh else study(work, "fresh-processes", worker=False)[0]
    with_worker, train = statistics.median(studies), statistics.median(trains)
    result = {
        "command": " ".join(["PYTHONPATH=. python benchmarks/smoke_study.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_before": [round(x, 2) for x in loads],
        "study_with_worker_s": [round(x, 1) for x in studies],
        "one_train_s": [round(x, 1) for x in trains],
        "study_fresh_processes_s": None if fresh is None else round(fresh, 1),
        "ratio_with_worker": round(with_worker / train, 2),
        "ratio_fresh_processes": None if fresh is None else round(fresh / train, 2),
    }
    (work / "smoke_study.json").write_text(json.dumps(result, indent=1))
    print(f"smoke study, worker:           {with_worker:6.1f} s median "
          f"({result['ratio_with_worker']}x one train)")
    if fresh is not None:
        print(f"smoke study, fresh processes:  {fresh:6.1f} s "
              f"({result['ratio_fresh_processes']}x one train)")
    print(f"one capsmed train of its runs: {train:6.1f} s median")
    return result


if __name__ == "__main__":
    main()
