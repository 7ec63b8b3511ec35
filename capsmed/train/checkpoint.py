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

from capsmed.data.digest import file_digest
from capsmed.errors import CapsmedError, first_line
from capsmed.io import atomic_path, write_failure, writing
from capsmed.models import create_model
from capsmed.train.run_config import CONFIG, read_run_config

WEIGHTS, META = "checkpoint.safetensors", "checkpoint.json"


def save_checkpoint(run_dir: Path, model: nn.Module, meta: dict[str, Any]) -> None:
    """Write weights and metadata atomically (metadata last: it marks a complete pair).

    Both are written in full before either is renamed into place, so a failed write
    (a full disk) leaves the previous pair as it was.
    """
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    weights, meta_path = Path(run_dir) / WEIGHTS, Path(run_dir) / META
    # the inner block renames first: the weights, then the metadata
    with atomic_path(meta_path) as meta_tmp, atomic_path(weights) as weights_tmp:
        try:
            save_file(state, str(weights_tmp))
        except Exception as exc:  # safetensors' own error types, or OSError
            raise write_failure(weights, exc) from None
        # the pair belongs together: a weights file from elsewhere is caught on loading
        meta = {**meta, "weights_digest": file_digest(weights_tmp)}
        with writing(meta_path):
            meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True),
                                encoding="utf-8")


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
    meta = _read_meta(meta_path)
    if meta.get("weights_digest") not in (None, file_digest(weights_path)):
        raise CapsmedError(f"{weights_path}: not the weights {META} was written with "
                           "(their digests differ): the two files come from different "
                           "checkpoints")
    _check_matches_config(run_dir, meta)
    try:
        model = create_model(meta["arch"], **meta["model_kwargs"])
    except CapsmedError as exc:
        raise CapsmedError(f"{meta_path}: {exc}") from None
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CapsmedError(f"{meta_path}: the model cannot be rebuilt from its arguments "
                           f"({first_line(exc)})") from None
    try:
        state = load_file(str(weights_path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types on corrupt files
        raise CapsmedError(f"{weights_path}: cannot read weights ({first_line(exc)})"
                           ) from None
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CapsmedError(f"{weights_path}: weights do not fit architecture "
                           f"'{meta['arch']}' ({first_line(exc)})") from None
    return model.to(device).eval(), meta


def _check_matches_config(run_dir: Path, meta: dict[str, Any]) -> None:
    """The checkpoint is of the run its ``config.yaml`` describes: same architecture,
    model arguments and classes (a checkpoint copied in from another run is not)."""
    config_path = run_dir / CONFIG
    if not config_path.is_file():
        return
    config = read_run_config(run_dir)  # a broken one: one line naming it
    pairs = (("arch", meta["arch"], config["train"].get("arch")),
             ("model arguments", meta["model_kwargs"], config["model_kwargs"]),
             ("classes", meta["class_names"], config["dataset"].get("class_names")))
    for what, ours, theirs in pairs:
        if theirs is not None and json.dumps(ours, sort_keys=True) != json.dumps(
                theirs, sort_keys=True):
            raise CapsmedError(f"{run_dir / META}: its {what} differ from {config_path}'s "
                               "(the checkpoint comes from another run)")


# What evaluate and the analyses read from checkpoint.json, and the JSON type of each.
META_FIELDS = {"arch": str, "model_kwargs": dict, "epoch": int, "data": str,
               "class_names": list}


def _read_meta(path: Path) -> dict[str, Any]:
    """``checkpoint.json``, checked to be the object :func:`save_checkpoint` writes."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CapsmedError(f"{path}: malformed checkpoint metadata ({first_line(exc)})"
                           ) from None
    if not isinstance(meta, dict):
        raise CapsmedError(f"{path}: malformed checkpoint metadata: a JSON "
                           f"{type(meta).__name__}, expected an object with "
                           f"{', '.join(META_FIELDS)}")
    wrong = [k for k, kind in META_FIELDS.items() if not isinstance(meta.get(k), kind)
             or isinstance(meta.get(k), bool)]
    if wrong:
        raise CapsmedError(f"{path}: malformed checkpoint metadata: {', '.join(wrong)} "
                           "missing or of the wrong type")
    return meta
