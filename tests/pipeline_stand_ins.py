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


def evaluated_run(run_dir: Path, arch: str, seed: int, macro_f1: float,
                  files: dict | None = None) -> Path:
    """A run folder as ``capsmed evaluate`` leaves it, scoring ``macro_f1`` on a toy
    two-class test split (what the study index and capsmed report read)."""
    finish_run(run_dir, (), files)
    (run_dir / "config.yaml").write_text(
        f"train: {{arch: {arch}, seed: {seed}, data: x.h5, epochs: 1}}\n"
        "dataset: {name: tupac16}\n")
    (run_dir / "metrics.jsonl").write_text(json.dumps(
        {"epoch": 1, "val_loss": 0.5, "val_acc": macro_f1}) + "\n")
    per_class = {name: {"precision": macro_f1, "sensitivity": macro_f1, "f1": macro_f1,
                        "support": 50} for name in ("a", "b")}
    report = {"arch": arch, "split": "test", "checkpoint_epoch": 1, "class_names": ["a", "b"],
              "per_class": per_class, "total": {"precision": macro_f1, "sensitivity": macro_f1,
                                                "f1": macro_f1, "support": 100},
              "accuracy": macro_f1, "balanced_accuracy": macro_f1,
              "confusion_matrix": [[round(50 * macro_f1), 50 - round(50 * macro_f1)],
                                   [50 - round(50 * macro_f1), round(50 * macro_f1)]]}
    (run_dir / "report").mkdir(parents=True, exist_ok=True)
    (run_dir / "report" / "report.json").write_text(json.dumps(report))
    return run_dir
