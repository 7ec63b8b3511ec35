"""What one job of a pipeline asks the machine or the cluster for.

A pipeline's ``resources:`` are every job's defaults; a rule's ``resources:`` change
them for the runs its ``when`` matches, and a data stage or an analysis may have its
own. ``gpus``, ``tasks`` and ``nodes`` shape one training run: data stages and
analyses get no GPU unless their own ``resources`` ask for one. The ``--slurm-*``
flags of ``capsmed run`` override any of them for every job.

The fields are the scheduler's usual vocabulary, so each executor maps them to its
own terms (Slurm: ``--gpus-per-node``, ``--time``, ``--partition``, ...); an executor
that has no use for one (the local one has no partition) ignores it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError

# The fields a training run shapes; a data stage or an analysis sets them itself.
RUN_SHAPE = ("gpus", "tasks", "nodes")
OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class Resources:
    """One job's request.

    ``gpus`` and ``tasks`` count the whole job (over its ``nodes``): a run given N GPUs
    trains data-parallel in N processes, one per GPU; ``tasks`` alone (no GPU) runs N
    CPU processes (gloo), which is how the multi-process path is tested without GPUs.
    """

    gpus: int | None = None  # None: not said (see capsmed.pipeline.runner)
    tasks: int | None = None  # processes [one per GPU, else 1]
    nodes: int = 1
    cpus: int | None = None  # per process
    mem_gb: float | None = None  # per node
    time_min: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch: tuple[tuple[str, str], ...] = ()  # further sbatch options, name -> value

    @property
    def processes(self) -> int:
        return self.tasks if self.tasks is not None else max(1, self.gpus or 0)

    def describe(self) -> str:
        """``1 GPU, 8 CPUs, 32 GB, 24h, partition gpu``: what the dry run shows."""
        parts = [f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else
                 "no GPU"]
        if self.processes > 1:
            parts.append(f"{self.processes} processes" + (
                f" on {self.nodes} nodes" if self.nodes > 1 else ""))
        if self.cpus:
            parts.append(f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}")
        if self.mem_gb:
            parts.append(f"{self.mem_gb:g} GB")
        if self.time_min:
            parts.append(f"{_duration(self.time_min)} limit")
        parts += [f"{name} {value}" for name, value in (
            ("partition", self.partition), ("account", self.account), ("qos", self.qos),
            ("constraint", self.constraint)) if value]
        parts += [f"--{k}={v}" if v != "" else f"--{k}" for k, v in self.sbatch]
        return ", ".join(parts)


def _duration(minutes: int) -> str:
    if minutes % 1440 == 0:
        return f"{minutes // 60}h" if minutes <= 2880 else f"{minutes // 1440}d"
    if minutes % 60 == 0:
        return f"{minutes // 60}h"
    return f"{minutes} min"


FIELDS = {f.name for f in dataclasses.fields(Resources)}
INTEGERS = ("gpus", "tasks", "nodes", "cpus", "time_min")
TEXTS = ("partition", "account", "qos", "constraint")


def check_resources(values: Any, where: str, path: Path | str) -> dict[str, Any]:
    """A ``resources:`` mapping, checked: known keys, whole numbers, texts, the
    ``sbatch`` options as a mapping of option names. Returns it with ``sbatch``
    normalised to ``{name: text}``."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise CapsmedError(f"{path}: {where}: expected a mapping of resources "
                           f"({', '.join(sorted(FIELDS))}), got '{values}'")
    bad = sorted(set(values) - FIELDS)
    if bad:
        raise CapsmedError(f"{path}: {where}: unknown resource(s) {', '.join(bad)} "
                           f"(known: {', '.join(sorted(FIELDS))})")
    out: dict[str, Any] = {}
    for key, value in values.items():
        out[key] = _checked_value(key, value, f"{where}.{key}", path)
    return out


def _checked_value(key: str, value: Any, where: str, path: Path | str) -> Any:
    if value is None:
        return None
    if key in INTEGERS:
        smallest = 0 if key == "gpus" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise CapsmedError(f"{path}: {where} must be a whole number >= {smallest}, "
                               f"got '{value}'")
        return value
    if key == "mem_gb":
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise CapsmedError(f"{path}: {where} must be a number of GB > 0, got '{value}'")
        return float(value)
    if key in TEXTS:
        if not isinstance(value, str | int) or isinstance(value, bool) or not str(value):
            raise CapsmedError(f"{path}: {where} must be a name, got '{value}'")
        return str(value)
    return _sbatch_options(value, where, path)


def _sbatch_options(value: Any, where: str, path: Path | str) -> dict[str, str | None]:
    """``{exclusive: true, gres: "gpu:a100:1"}``: each an sbatch long option's name
    (``true`` for a flag); the options capsmed sets itself are refused here. ``false``
    (or null) is kept as None: it removes the option a layer below set (a rule's
    ``exclusive: false`` under a pipeline-wide ``exclusive: true``)."""
    if not isinstance(value, Mapping):
        raise CapsmedError(f"{path}: {where}: expected a mapping of sbatch option: value, "
                           f"got '{value}'")
    out = {}
    for name, item in value.items():
        name = str(name).lstrip("-")
        if not OPTION_NAME.match(name):
            raise CapsmedError(f"{path}: {where}: '{name}' is not an sbatch option name")
        if name in RESERVED_SBATCH:
            raise CapsmedError(f"{path}: {where}: --{name} is set by capsmed "
                               f"({RESERVED_SBATCH[name]})")
        longer = sorted(r for r in RESERVED_SBATCH if r.startswith(name))
        if longer:  # sbatch takes an unambiguous prefix for the whole name
            raise CapsmedError(f"{path}: {where}: --{name} is sbatch's short form of "
                               f"--{longer[0]}, which is set by capsmed "
                               f"({RESERVED_SBATCH[longer[0]]})")
        out[name] = None if item is False or item is None else \
            "" if item is True else str(item)
    return out


# sbatch options capsmed writes itself, and the resource that sets each.
RESERVED_SBATCH = {
    "gpus-per-node": "resources.gpus", "gres": "resources.gpus", "gpus": "resources.gpus",
    "nodes": "resources.nodes", "ntasks-per-node": "resources.tasks",
    "ntasks": "resources.tasks",  # it wins over --ntasks-per-node: one process fewer
    "cpus-per-task": "resources.cpus", "mem": "resources.mem_gb",
    "time": "resources.time_min", "partition": "resources.partition",
    # Slurm may start the job with its limit lowered to --time-min; the executor saves
    # and requeues just before the full resources.time_min, after such a job was killed
    "time-min": "resources.time_min",
    "account": "resources.account", "qos": "resources.qos",
    "constraint": "resources.constraint", "array": "one job array per group of runs",
    "dependency": "the order of the pipeline's jobs", "signal": "the executor's "
    "signal_lead_s", "output": "OUT/.capsmed-run/slurm/", "error": "OUT/.capsmed-run/slurm/",
    "job-name": "the pipeline's name"}


def merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win, key by key; ``sbatch`` options merge option by option."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "sbatch" and isinstance(out.get(key), dict):
                out[key] = {**out[key], **(value or {})}
            else:
                out[key] = value
    return out


def build(values: Mapping[str, Any], where: str, path: Path | str) -> Resources:
    """A :class:`Resources` from checked, merged values; their shape is checked here."""
    kwargs = {k: v for k, v in values.items() if v is not None and k != "sbatch"}
    sbatch = tuple(sorted((k, v) for k, v in (values.get("sbatch") or {}).items()
                          if v is not None and v is not False))  # False: removed
    res = Resources(**kwargs, sbatch=sbatch)
    if res.gpus and res.tasks is not None and res.tasks != res.gpus:
        raise CapsmedError(f"{path}: {where}: tasks {res.tasks} with gpus {res.gpus}: a run "
                           "trains in one process per GPU (leave tasks out)")
    if res.processes % res.nodes or (res.gpus and res.gpus % res.nodes):
        raise CapsmedError(f"{path}: {where}: {res.processes} process(es) do not spread "
                           f"evenly over {res.nodes} nodes")
    return res


def without_run_shape(values: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline-wide values a data stage or an analysis inherits."""
    return {k: v for k, v in values.items() if k not in RUN_SHAPE}
