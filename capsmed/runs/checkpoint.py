"""Reading a run's checkpoint: the model rebuilt from ``checkpoint.json`` and its
safetensors weights, checked to belong together and to the run's ``config.yaml``.

Nothing is unpickled: a run directory can come from anywhere and still be safe to load.
:func:`capsmed.train.checkpoint.save_checkpoint` writes the pair.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsmed.errors import CapsmedError, first_line
from capsmed.models import create_model
from capsmed.train.checkpoint import META, WEIGHTS, parse_weights, read_checked_weights
from capsmed.train.run_config import CONFIG, read_run_config

# What evaluate and the analyses read from checkpoint.json, and the JSON type of each.
META_FIELDS = {"arch": str, "model_kwargs": dict, "epoch": int, "data": str,
               "class_names": list}


def checkpoint_meta(run_dir: Path) -> dict[str, Any]:
    """``run_dir``'s ``checkpoint.json`` alone (no weights loaded), checked."""
    path = Path(run_dir) / META
    if not path.is_file():
        raise CapsmedError(f"{run_dir}: no checkpoint ({META}); is it a finished run of "
                           "capsmed train?")
    return read_meta(path)


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
    meta = read_meta(meta_path)
    blob, _ = read_checked_weights(weights_path, meta.get("weights_digest"))
    _check_matches_config(run_dir, meta)
    try:
        model = create_model(meta["arch"], **meta["model_kwargs"])
    except CapsmedError as exc:
        raise CapsmedError(f"{meta_path}: {exc}") from None
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CapsmedError(f"{meta_path}: the model cannot be rebuilt from its arguments "
                           f"({first_line(exc)})") from None
    state = parse_weights(blob, weights_path)
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


def read_meta(path: Path) -> dict[str, Any]:
    """``checkpoint.json``, checked to be the object
    :func:`capsmed.train.checkpoint.save_checkpoint` writes."""
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
