"""Checkpoints: safetensors weights + a JSON of the architecture and its arguments.

Nothing is unpickled: a run directory can come from anywhere and still be safe to load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.io import atomic_path, write_text_atomic
from capsmed.models import create_model

WEIGHTS, META = "checkpoint.safetensors", "checkpoint.json"


def save_checkpoint(run_dir: Path, model: nn.Module, meta: dict[str, Any]) -> None:
    """Write weights and metadata atomically (metadata last: it marks a complete pair)."""
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with atomic_path(Path(run_dir) / WEIGHTS) as tmp:
        save_file(state, str(tmp))
    write_text_atomic(Path(run_dir) / META, json.dumps(meta, indent=2, sort_keys=True))


def load_checkpoint(run_dir: Path, device: str | torch.device = "cpu"
                    ) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model from ``checkpoint.json`` and load its weights."""
    run_dir = Path(run_dir)
    meta_path, weights_path = run_dir / META, run_dir / WEIGHTS
    if not run_dir.is_dir():
        raise CapsmedError(f"{run_dir}: no such run directory")
    if not meta_path.is_file() or not weights_path.is_file():
        raise CapsmedError(f"{run_dir}: no checkpoint ({META} + {WEIGHTS}); did training "
                           "finish at least one epoch?")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        model = create_model(meta["arch"], **meta["model_kwargs"])
        state = load_file(str(weights_path), device="cpu")
    except (json.JSONDecodeError, KeyError) as exc:
        raise CapsmedError(f"{meta_path}: malformed checkpoint metadata ({exc})") from exc
    except Exception as exc:  # safetensors raises its own error types on corrupt files
        if isinstance(exc, CapsmedError):
            raise
        raise CapsmedError(f"{weights_path}: cannot read weights ({exc})") from exc
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CapsmedError(f"{weights_path}: weights do not fit architecture "
                           f"'{meta['arch']}' ({str(exc).splitlines()[0]})") from exc
    return model.to(device).eval(), meta
