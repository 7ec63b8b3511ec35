"""What Slurm says of jobs: ``squeue`` for those it holds, ``sacct`` for those that
left its queue, both parsed into ``id -> (state, detail)`` with array tasks expanded."""

from __future__ import annotations

import getpass
import shutil
import subprocess
from collections.abc import Sequence

from capsmed.errors import CapsmedError


def squeue() -> dict[str, tuple[str, str]]:
    """This user's jobs Slurm holds: id (array tasks expanded) -> (state, reason)."""
    proc = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%r"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise CapsmedError(f"squeue failed: {proc.stderr.strip()[:200]}")
    return id_pairs(proc.stdout)


def sacct(job_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
    """id -> (State, ExitCode) of ended jobs; {} where sacct cannot answer (no
    accounting on this cluster).

    Array tasks that never started (cancelled while pending) share one record of
    their array, ``13_[2-4,7%2]``, which ``sacct -j 13_2`` does not find (Slurm
    22.05): the arrays are asked for whole and their ranges expanded."""
    if shutil.which("sacct") is None:
        return {}
    arrays = dict.fromkeys(job_id.split("_")[0] for job_id in job_ids)
    proc = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(arrays), "-o",
                           "JobID,State,ExitCode"], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        return {}
    found = id_pairs(proc.stdout)
    ranges = {task: answer for job_id, answer in found.items() if "[" in job_id
              for task in array_tasks(job_id)}
    return {**ranges, **{k: v for k, v in found.items() if "[" not in k}}  # own record wins


def array_tasks(job_id: str) -> list[str]:
    """``13_[0-2,5,9-13:2%2]`` -> 13_0, 13_1, 13_2, 13_5, 13_9, 13_11, 13_13 (the
    ``%`` throttle dropped); any other id is itself."""
    array, _, tasks = job_id.partition("_[")
    if not tasks.endswith("]"):
        return [job_id]
    out = []
    for part in tasks[:-1].split("%")[0].split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        try:
            numbers = range(int(first), int(last or first) + 1, int(step or 1))
        except ValueError:
            return [job_id]  # not a range this reads: left as Slurm wrote it
        out.extend(f"{array}_{n}" for n in numbers)
    return out


def id_pairs(text: str) -> dict[str, tuple[str, str]]:
    """``id|a|b`` lines (squeue's and sacct's parsable output) -> id -> (a, b)."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    return out
