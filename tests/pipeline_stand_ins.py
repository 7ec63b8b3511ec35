"""Stand-ins of what a pipeline's jobs leave, for tests that train nothing."""

from __future__ import annotations

import json
from pathlib import Path

from capsmed.data.digest import file_digest


def write_checkpoint(run_dir: Path, weights: bytes = b"weights") -> Path:
    """A checkpoint pair whose recorded digest matches its weights (as training writes
    it); returns the weights file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "checkpoint.safetensors"
    path.write_bytes(weights)
    (run_dir / "checkpoint.json").write_text(json.dumps(
        {"arch": "lenet", "model_kwargs": {}, "epoch": 1, "data": "x.h5",
         "class_names": ["a", "b"], "weights_digest": file_digest(path)}))
    return path


def finish_run(run_dir: Path, evaluations: tuple[str, ...] = ("report",),
               files: dict | None = None) -> Path:
    """A run folder as a finished, evaluated run leaves it."""
    write_checkpoint(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({"epochs_run": 1}))
    for name in evaluations:
        (run_dir / name).mkdir(parents=True, exist_ok=True)
        (run_dir / name / "report.json").write_text("{}")
    for name, value in (files or {}).items():
        path = run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return run_dir
