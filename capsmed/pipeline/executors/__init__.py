"""The executors ``capsmed run --executor NAME`` can use, by name.

Adding one (Ray, Kubernetes, ...) is one new module in this folder with a class that
implements :class:`~capsmed.pipeline.executors.base.Executor`, plus its line in
:data:`EXECUTORS`. Modules are imported when first used, so an executor's library
(submitit for Slurm) is needed only by those who use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capsmed.errors import CapsmedError
from capsmed.pipeline.executors.base import Executor, ExecutorSettings

# name -> "module:class"
EXECUTORS = {
    "local": "capsmed.pipeline.executors.local:LocalExecutor",
    "slurm": "capsmed.pipeline.executors.slurm:SlurmExecutor",
}


def executor_class(name: str) -> type[Executor]:
    """The class registered as ``name``; an unknown name is a one-line error."""
    if name not in EXECUTORS:
        raise CapsmedError(f"--executor must be one of {', '.join(EXECUTORS)}, got '{name}'")
    module, _, attr = EXECUTORS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def create_executor(name: str, settings: ExecutorSettings) -> Executor:
    return executor_class(name)(settings)


def check_executor_section(section: Mapping[str, Any], path: Path) -> None:
    """The pipeline's ``executor:`` section: ``kind``, ``jobs``, ``gpus`` and one
    mapping per executor of its own options (a misspelt key would be dropped)."""
    common = {"kind", "jobs", "gpus"}
    bad = sorted(set(section) - common - set(EXECUTORS))
    if bad:
        raise CapsmedError(f"{path}: executor: unknown key(s) {', '.join(bad)} (allowed: "
                           f"{', '.join([*sorted(common), *EXECUTORS])})")
    kind = section.get("kind", "local")
    if kind not in EXECUTORS:
        raise CapsmedError(f"{path}: executor.kind must be one of {', '.join(EXECUTORS)}, "
                           f"got '{kind}'")
    for name in EXECUTORS:
        options = section.get(name) or {}
        if not isinstance(options, Mapping):
            raise CapsmedError(f"{path}: executor.{name}: expected a mapping of options")
        allowed = executor_class(name).OPTIONS
        bad = sorted(set(options) - allowed)
        if bad:
            raise CapsmedError(f"{path}: executor.{name}: unknown option(s) {', '.join(bad)}"
                               f" (known: {', '.join(sorted(allowed)) or 'none'}"
                               "; what a job asks for goes under 'resources:')")


__all__ = ["EXECUTORS", "Executor", "ExecutorSettings", "check_executor_section",
           "create_executor", "executor_class"]
