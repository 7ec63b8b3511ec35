"""Wall time, CPU time and peak memory of ``capsmed preprocess`` at full dataset scale,
beside its floor.

Synthesises (untimed) TUPAC16 as 73 cases x one 2000x2000 image and DIARETDB1 as 89
images of 1500x1152 -- the real datasets' sizes -- then preprocesses each with default
parameters in a fresh process, once on the full set and once on a subset (hard links,
no copies) to show whether memory grows with the number of images. Prints a Markdown
table and appends one JSON line per run to ``--results``.

Memory is measured three ways: the peak resident set of the preprocessing process
itself and of its largest worker (``ru_maxrss``), and the peak of the summed resident
sets of the whole process tree, sampled from ``/proc`` every 50 ms (Linux only; shared
library pages count once per process, so it is an upper bound). CPU time is user + sys
of the tree; on a shared machine compare it, not only the wall time.

The floor is what any preprocessing of these files must do, timed in the same run on
one core: read every file the source reads and apply the per-pixel transform
(TUPAC16: each image, ``rgb2hed``; DIARETDB1: each fundus image and its four lesion
confidence maps, decoded with OpenCV, CLAHE on LAB lightness). Each full set is
preprocessed with one worker at one thread (OpenMP, BLAS and OpenCV, as the floor and
as each worker of a pool; to set beside the single-core floor) and with the
default worker count (one per CPU, up to 8), which must never be slower than one worker.

    .venv/bin/python benchmarks/preprocess.py [--only tupac16|diaretdb1]
        [--workdir bench_out] [--profile]
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

FULL = {"tupac16": 73, "diaretdb1": 89}
SMALL = {"tupac16": 15, "diaretdb1": 20}
TARGET_S = {"tupac16": 60, "diaretdb1": 30}

CHILD = """
import json, resource, sys, time
from pathlib import Path
from capsmed.data.pool import default_workers
from capsmed.progress import set_progress_enabled
set_progress_enabled(False)
name, raw, out, workers, profile = sys.argv[1:6]
workers = 1 if profile == "1" else int(workers)
if workers == 1:  # one core, as the floor and as each worker of a pool runs
    import cv2
    cv2.setNumThreads(1)
if name == "tupac16":
    from capsmed.data.sources.tupac16.reader import Tupac16Config as Config
    from capsmed.data.sources.tupac16.reader import preprocess_tupac16 as run
else:
    from capsmed.data.sources.diaretdb1.reader import Diaretdb1Config as Config
    from capsmed.data.sources.diaretdb1.reader import preprocess_diaretdb1 as run
t = time.perf_counter()
if profile == "1":
    import cProfile, pstats
    prof = cProfile.Profile()
    prof.runcall(run, Path(raw), Path(out), Config(workers=1))
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
else:
    run(Path(raw), Path(out), Config(workers=workers))
wall = time.perf_counter() - t
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"preprocess_s": wall, "workers": default_workers(workers),
                  "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                  "main_peak_mib": me.ru_maxrss / 1024, "worker_peak_mib": kids.ru_maxrss / 1024}))
"""


def _tree_rss_kib(root: int) -> int:
    """Summed VmRSS (KiB) of ``root`` and all its descendants, read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid and p not in tree]
        tree.update(kids)
        frontier += kids
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def measure(name: str, raw: Path, out: Path, workers: int, profile: bool) -> dict:
    """Preprocess ``raw`` in a fresh process; wall time, CPU time and peak memory.

    An earlier run of this benchmark stopped mid-way (Ctrl-C) leaves its finished
    results beside ``out`` (:class:`capsmed.data.resume.ResultCache`), which capsmed
    reuses: they are removed first, so every image is preprocessed in the time taken.
    """
    out.unlink(missing_ok=True)
    for cache in out.parent.glob(f".{out.name}.cache-*"):
        shutil.rmtree(cache)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    one_core = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"} \
        if workers == 1 or profile else {}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, name, str(raw), str(out),
                             str(workers), "1" if profile else "0"],
                            env={**os.environ, **one_core}, stdout=subprocess.PIPE,
                            stderr=None if profile else subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss_kib(proc.pid))
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    total = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{name} preprocessing failed:\n{stderr}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result.update(process_s=total, tree_peak_mib=peak / 1024, load_before=load,
                  load_after=os.getloadavg()[0], output_mib=out.stat().st_size / 2**20)
    return result


FLOOR = """
import json, sys, time
from pathlib import Path
name, raw = sys.argv[1], Path(sys.argv[2])
t = time.perf_counter()
if name == "tupac16":
    from skimage.color import rgb2hed
    from capsmed.data.images import read_rgb_tiff
    for tif in sorted(raw.rglob("*.tif")):
        rgb2hed(read_rgb_tiff(tif))
else:  # OpenCV's decoder: the fastest here (Pillow, which capsmed uses, is slower)
    import cv2
    cv2.setNumThreads(1)  # as a worker runs (capsmed.data.pool); OpenCV's own pool else
    clahe = cv2.createCLAHE(clipLimit=3.0, tileGridSize=(8, 8))
    for png in sorted(raw.rglob("ddb1_fundusimages/*.png")):
        clahe.apply(cv2.cvtColor(cv2.imread(str(png)), cv2.COLOR_BGR2LAB)[..., 0])
    for png in sorted(raw.rglob("ddb1_groundtruth/*/*.png")):  # 4 lesion maps an image
        cv2.imread(str(png), cv2.IMREAD_UNCHANGED)
print(json.dumps({"floor_s": time.perf_counter() - t}))
"""


def floor(name: str, raw: Path) -> float:
    """Seconds to read every image and apply the per-pixel transform (one process,
    OpenMP/BLAS and OpenCV at one thread, as a worker runs)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", FLOOR, name, str(raw)], check=True,
                         capture_output=True, text=True, env=env).stdout
    return float(json.loads(out.strip().splitlines()[-1])["floor_s"])


SYNTH = """
import sys
from pathlib import Path
from capsmed.data.sources.diaretdb1.synth import write_diaretdb1
from capsmed.data.sources.tupac16.synth import write_tupac16
name, raw, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if name == "tupac16":
    write_tupac16(raw, cases=count, images_per_case=1, size=2000, seed=0)
else:
    write_diaretdb1(raw, images=count, size=(1500, 1152), seed=0)
"""


def synthesise(name: str, root: Path) -> Path:
    """Full-scale synthetic raw data under ``root`` (reused when already there).

    It runs in its own process: a child inherits its parent's peak RSS through fork and
    exec on Linux, so a big benchmark process would inflate every ``ru_maxrss`` below.
    """
    raw = root / f"{name}-raw"
    stamp = root / f"{name}-raw.done"
    if stamp.exists():
        return raw
    if raw.exists():
        raise SystemExit(f"{raw}: exists but is incomplete; delete it and rerun")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", SYNTH, name, str(raw), str(FULL[name])], check=True)
    stamp.write_text(f"synthesised in {time.perf_counter() - start:.0f} s\n")
    return raw


def subset(name: str, raw: Path, count: int) -> Path:
    """The first ``count`` cases / images of ``raw`` as hard links, same layout."""
    dst = raw.with_name(f"{raw.name}-first{count}")
    if dst.exists():
        return dst
    for src in sorted(p for p in raw.rglob("*") if p.is_file()):
        rel = src.relative_to(raw)
        if name == "tupac16" and int(rel.parts[1]) > count:  # part_N/<CC>/<NN>.tif
            continue
        if name == "diaretdb1" and src.suffix == ".png" and int(src.stem[-3:]) > count:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".txt":  # split lists: keep only the images that are there
            keep = [ln for ln in src.read_text().splitlines() if int(ln[-7:-4]) <= count]
            target.write_text("".join(f"{ln}\n" for ln in keep))
        else:
            os.link(src, target)
    return dst


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                  .splitlines() if ln.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} CPU(s), {model}, {platform.system()} {platform.machine()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(FULL), action="append",
                        help="Benchmark only this dataset (repeatable).")
    parser.add_argument("--workdir", type=Path, default=Path("bench_out"),
                        help="Where synthetic data, outputs and results go (reused).")
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON-lines file to append to [WORKDIR/preprocess.jsonl].")
    parser.add_argument("--profile", action="store_true",
                        help="Also profile one full run in-process (workers=1); top 15 "
                             "functions by own time go to stderr.")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = args.results or args.workdir / "preprocess.jsonl"
    print(f"machine: {machine()}\n")
    print("| dataset | images | workers | floor s | preprocess s | x floor | CPU s "
          "| tree peak MiB | main peak MiB | worker peak MiB | load | target |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.only or sorted(FULL):
        raw = synthesise(name, args.workdir)
        for count, workers in ((FULL[name], 1), (FULL[name], 0), (SMALL[name], 0)):
            source = raw if count == FULL[name] else subset(name, raw, count)
            low = floor(name, source) if workers == 1 else None
            r = measure(name, source, args.workdir / f"{name}-{count}.h5", workers, False)
            r.update(dataset=name, images=count, floor_s=low, machine=machine(),
                     time=time.strftime("%Y-%m-%dT%H:%M:%S"))
            with results.open("a", encoding="utf-8") as f:
                f.write(json.dumps(r) + "\n")
            target = (f"<= {TARGET_S[name]} s: "
                      f"{'met' if r['process_s'] <= TARGET_S[name] else 'missed'}"
                      if count == FULL[name] and workers == 0 else "")
            ratio = f"{r['preprocess_s'] / low:.2f}" if low else ""
            print(f"| {name} | {count} | {r['workers']} | {low or 0:.1f} | "
                  f"{r['preprocess_s']:.1f} | {ratio} | {r['cpu_s']:.1f} | "
                  f"{r['tree_peak_mib']:.0f} | {r['main_peak_mib']:.0f} | "
                  f"{r['worker_peak_mib']:.0f} | {r['load_before']:.1f} | {target} |",
                  flush=True)
        if args.profile:
            print(f"\nprofile of {name} (workers=1) on stderr", file=sys.stderr)
            measure(name, raw, args.workdir / f"{name}-profile.h5", 1, True)


if __name__ == "__main__":
    main()
