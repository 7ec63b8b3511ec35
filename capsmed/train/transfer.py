"""Layer transfer (paper 003's AnB / BnB): parameters copied from another run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capsmed.errors import CapsmedError, first_line

log = logging.getLogger(__name__)


def transfer_parameters(model: torch.nn.Module, source: Path, prefixes: list[str],
                        freeze: bool, *, arch: str) -> dict[str, Any]:
    """Copy the parameters whose names start with one of ``prefixes`` from the checkpoint
    in run directory ``source`` (paper 003's layer transfer), with their buffers (batch
    norms' running statistics, which the copied weights were trained with); optionally
    freeze the parameters, and the batch norms' statistics with them. ``arch`` is the
    model's architecture: the source must be a finished run of it.

    Returns:
        What config.yaml records of the source: its resolved folder, the epoch of its
        checkpoint and the digest of its weights.

    Raises:
        CapsmedError: if the source is unfinished, of another architecture, or its
            checkpoint is not one pair; if a prefix matches nothing, or the layers it
            names differ between the two models (a name or shape one lacks).
    """
    from safetensors.torch import load_file

    from capsmed.data.digest import file_digest
    from capsmed.train.checkpoint import META, WEIGHTS
    from capsmed.train.run_config import RESUME_FILE

    source = Path(source)
    path = source / WEIGHTS
    if (source / RESUME_FILE).is_file():  # its checkpoint is of an intermediate epoch
        raise CapsmedError(f"{source}: its training has not finished ({RESUME_FILE} is "
                           "there), so it would lend the layers of an intermediate epoch; "
                           f"finish it first: capsmed train --resume {source}")
    if not path.is_file() or not (source / META).is_file():
        raise CapsmedError(f"{path}: no checkpoint to transfer from")
    meta = _source_meta(source / META)
    digest = file_digest(path)
    if meta.get("weights_digest") not in (None, digest):
        raise CapsmedError(f"{path}: not the weights {META} was written with (their "
                           "digests differ): the two files come from different checkpoints")
    if meta.get("arch") != arch:  # same names and shapes need not mean the same layers
        raise CapsmedError(f"{source}: a run of architecture '{meta.get('arch')}'; layers "
                           f"transfer between runs of the same architecture ('{arch}')")
    weights = load_file(str(path))
    params = dict(model.named_parameters())
    ours = model.state_dict()  # parameters and their layers' buffers
    copied = []
    for prefix in prefixes:
        def inside(name: str, prefix: str = prefix) -> bool:
            return name == prefix or name.startswith(prefix + ".")

        names = [n for n in params if inside(n)]
        if not names:
            tops = ", ".join(sorted({n.split(".")[0] for n in params}))
            raise CapsmedError(f"transfer layer '{prefix}' matches no parameter of the "
                               f"model (it has: {tops})")
        # the whole layer or nothing: a tensor only one side has (a deeper block, a
        # batch norm) would leave the copy computing something its source never did
        layer = {n for n in ours if inside(n)} | {n for n in weights if inside(n)}
        differ = sorted(n for n in layer if n not in ours or n not in weights
                        or weights[n].shape != ours[n].shape)
        if differ:
            raise CapsmedError(f"{path}: parameter '{differ[0]}' is missing or has another "
                               f"shape in one of the two models (layer '{prefix}'); transfer "
                               "between the same architecture, options and input")
        for name in names:
            with torch.no_grad():
                params[name].copy_(weights[name])
            params[name].requires_grad_(not freeze)
            copied.append(name)
        for name, buffer in model.named_buffers():  # batch norms' running statistics
            if inside(name) and name in weights:
                with torch.no_grad():
                    buffer.copy_(weights[name])
    if freeze:
        _freeze_norm_statistics(model, prefixes)
    log.info("transferred %d parameter tensors from %s%s", len(copied), source,
             " (frozen)" if freeze else "")
    return {"run": str(source.resolve()), "epoch": meta.get("epoch"),
            "weights_digest": digest}


def _source_meta(path: Path) -> dict[str, Any]:
    """The source run's ``checkpoint.json`` (an object), or one line naming it."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CapsmedError(f"{path}: malformed checkpoint metadata ({first_line(exc)})"
                           ) from None
    if not isinstance(meta, dict):
        raise CapsmedError(f"{path}: malformed checkpoint metadata (not a JSON object)")
    return meta


def _keep_eval(module: torch.nn.Module, _inputs: object) -> None:
    module.training = False  # model.train() would set it again: undone before each call


def _freeze_norm_statistics(model: torch.nn.Module, prefixes: list[str]) -> None:
    """Batch norms inside frozen layers normalise with their transferred running
    statistics and never update them, whatever ``model.train()`` says: in training mode
    they would normalise by each batch and drift, and the frozen layers would compute
    something other than what was transferred."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and any(
                name == p or name.startswith(p + ".") for p in prefixes):
            module.eval()
            module.register_forward_pre_hook(_keep_eval)


def check_source_rows(source: Path, data_digest: str, test_split: str,
                      test_rows: np.ndarray | None) -> None:
    """Refuse a source trained on rows this run tests on (the same file by content, its
    training split this run's test split): its layers have seen the test samples, e.g.
    a cross-validation run transferring from a run of another fold.

    Raises:
        CapsmedError: naming the source and how many test rows it trained on.
    """
    from capsmed.train.run_config import read_run_config
    from capsmed.train.run_data import TRAIN_ROWS, read_saved_rows

    dataset = read_run_config(source)["dataset"]
    path = Path(source) / TRAIN_ROWS
    if dataset.get("digest") != data_digest or dataset.get("train_split") != test_split \
            or not path.is_file():
        return
    trained = read_saved_rows(path)
    seen = trained if test_rows is None else np.intersect1d(trained, test_rows)
    if len(seen):
        raise CapsmedError(f"{source}: trained on {len(seen)} of the rows this run tests on "
                           f"(split '{test_split}' of the same file), so its layers have "
                           "seen the test samples; transfer from a run of the same fold, or "
                           "of other data")
