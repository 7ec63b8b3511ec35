"""Resumable training state: everything needed to continue a run exactly.

``RUN_DIR/resume.pt`` holds the model, optimiser, schedule and loss-scaler state, the
sampler's generator state at the start of the current epoch (the epoch's batches are
regenerated and the finished ones skipped), the augmentation and global RNG states,
the partial epoch's sums and the early-stopping counters. It is written when the run
starts, at most every ``state_every_minutes`` after that, at the end of training and
when a run is stopped (Ctrl-C, SIGTERM, SIGUSR2), and removed when the run finishes
(:class:`capsmed.train.handlers.resumable_state.ResumableState`). It is read with
``torch.load(weights_only=True)``: tensors and plain containers only, nothing is
unpickled.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from capsmed.errors import CapsmedError, first_line
from capsmed.io import atomic_path, write_failure
from capsmed.train.protocol import SESSION_OPTIONS
from capsmed.train.run_config import RESUME_FILE, SUMMARY

STATE_VERSION = 1

# what a resumed run may change: SESSION_OPTIONS (another machine, device or tracker),
# and ``data``, which may move (its content digest is checked)
MAY_CHANGE_ON_RESUME = SESSION_OPTIONS | {"data"}


@dataclass
class Progress:
    """Where a run is: the loop's counters (plain numbers, saved with the state)."""

    epoch: int = 1  # the epoch in progress (1-based)
    step: int = 0  # its finished steps
    loss_sum: float = 0.0
    correct: float = 0.0
    seen: int = 0
    best: float = float("inf")
    best_epoch: int = 0
    global_step: int = 0
    epoch_seconds: float = 0.0  # time already spent in this epoch before a resume
    stopped_early: bool = False  # early stopping ended the run after epoch - 1
    extra: dict[str, Any] = field(default_factory=dict)


def save_state(run_dir: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               schedule: Any, scaler: torch.amp.GradScaler, sampler_state: torch.Tensor,
               augment_rng: torch.Generator | None, progress: Progress,
               options: str | None = None) -> Path:
    """Write ``resume.pt`` atomically (``options``: :func:`run_options` of the run)."""
    state = {
        "version": STATE_VERSION,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "scaler": scaler.state_dict(),
        "sampler": sampler_state.clone(),
        "augment": augment_rng.get_state() if augment_rng is not None else None,
        # a generator's state is of its device type (CPU and CUDA states differ)
        "augment_device": augment_rng.device.type if augment_rng is not None else None,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "progress": asdict(progress),
    }
    if options is not None:
        state["options"] = options
    path = Path(run_dir) / RESUME_FILE
    with atomic_path(path) as tmp:
        try:
            torch.save(state, tmp)
        except (OSError, RuntimeError) as exc:  # a full disk is a RuntimeError in torch
            raise write_failure(path, exc) from None
    return path


def load_state(run_dir: Path) -> dict[str, Any]:
    """Read ``resume.pt`` (weights-only unpickler)."""
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        finished = (Path(run_dir) / SUMMARY).is_file()
        raise CapsmedError(f"{path}: no resumable state; " + (
            "the run finished (nothing to resume)" if finished else
            "it was removed (a run keeps one from its start until it finishes)"))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's text runs to lines of advice to unpickle it
        raise CapsmedError(f"{path}: not a capsmed resumable state: it holds pickled Python "
                           "objects, which capsmed does not load") from None
    except Exception as exc:  # corrupt, truncated or foreign
        raise CapsmedError(f"{path}: cannot read resumable state ({first_line(exc)})"
                           ) from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise CapsmedError(f"{path}: state version {found} is not {STATE_VERSION}; resume "
                           "with the capsmed that wrote it")
    wrong = [k for k, kind in STATE_FIELDS.items() if not isinstance(state.get(k), kind)]
    if not isinstance(state.get("options", ""), str):
        wrong.append("options")
    if not wrong and not state["model"]:
        wrong = ["model (empty)"]
    if not wrong and set(state["progress"]) - {f.name for f in fields(Progress)}:
        wrong = ["progress"]
    if wrong:
        raise CapsmedError(f"{path}: not a complete resumable state ({', '.join(wrong)} "
                           "missing or of the wrong type)")
    return state


# Each entry of resume.pt and its type (augment is None without augmentation).
STATE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model": dict, "optimizer": dict, "schedule": dict, "scaler": dict,
    "sampler": torch.Tensor, "augment": (torch.Tensor, type(None)),
    "torch_rng": torch.Tensor, "cuda_rng": list, "progress": dict}


def run_options(train: dict[str, Any], model_kwargs: dict[str, Any]) -> str:
    """What a run computes from (its options but :data:`MAY_CHANGE_ON_RESUME`, and its model
    arguments), as ``resume.pt`` records it: JSON text."""
    kept = {k: v for k, v in train.items() if k not in MAY_CHANGE_ON_RESUME}
    return json.dumps({"train": kept, "model_kwargs": model_kwargs}, sort_keys=True)


def check_options_unchanged(state: dict[str, Any], options: str, config_path: Path) -> None:
    """Refuse to resume when ``config.yaml``'s options (``options``, from
    :func:`run_options`) differ from those the state was trained with: the rest of the
    run would silently train otherwise (a learning rate the optimiser's saved state
    overrides, other batches) while config.yaml claimed the edited values. A state
    written before options were recorded is not checked."""
    if "options" not in state:
        return
    now = json.loads(options)
    try:
        then = json.loads(state["options"])
        # a training option only one side has is one a capsmed version added or
        # dropped (at its default), not an edit; a model argument is always given
        keys = {"train": then["train"].keys() & now["train"].keys(),
                "model_kwargs": then["model_kwargs"].keys() | now["model_kwargs"].keys()}
        changed = [(f"{prefix}{k}", then[part].get(k), now[part].get(k))
                   for part, prefix in (("train", ""), ("model_kwargs", "model_kwargs."))
                   for k in sorted(keys[part]) if then[part].get(k) != now[part].get(k)]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise CapsmedError(f"{config_path.parent / RESUME_FILE}: not a complete resumable "
                           "state (options unreadable)") from None
    if changed:
        edits = ", ".join(f"{k} {json.dumps(a)} -> {json.dumps(b)}" for k, a, b in changed)
        raise CapsmedError(f"{config_path}: options edited since the run started ({edits}): "
                           "the rest of the run would train otherwise than its start; "
                           "restore them, or train a new run")


def restore_rng(state: dict[str, Any], augment_rng: torch.Generator | None) -> None:
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    if augment_rng is not None and state["augment"] is not None:
        saved, here = state.get("augment_device"), augment_rng.device.type
        try:
            if saved not in (None, here):
                raise ValueError(saved)
            augment_rng.set_state(state["augment"])
        except (RuntimeError, ValueError):  # "Expected a CPUGeneratorImplState", ...
            raise CapsmedError(
                f"its augmentation draws were made on {saved or 'another kind of device'}: "
                f"resume it on such a device (this run's is {here}); a random "
                "generator's state does not move between CPU and GPU") from None
