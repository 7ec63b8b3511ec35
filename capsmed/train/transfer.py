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
                        freeze: bool, *, arch: str, classes: list[str] | None = None,
                        model_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy the parameters whose names start with one of ``prefixes`` from the checkpoint
    in run directory ``source`` (paper 003's layer transfer), with their buffers (batch
    norms' running statistics, which the copied weights were trained with); optionally
    freeze the parameters, and the batch norms' statistics with them. ``arch`` is the
    model's architecture: the source must be a finished run of it. ``classes`` (this
    run's class names) and ``model_kwargs`` (the model's arguments) let its class layer
    (:func:`class_layer`) be refused when the source's classes are others, or the same
    in another order.

    Returns:
        What config.yaml records of the source: its resolved folder, the epoch of its
        checkpoint and the digest of its weights.

    Raises:
        CapsmedError: if the source is unfinished, of another architecture, or its
            checkpoint is not one pair; if a prefix matches nothing, or the layers it
            names differ between the two models (a name or shape one lacks), or
            include the class layer and the two runs' classes differ; if nothing would
            be left to train.
    """
    from capsmed.train.checkpoint import (
        META,
        WEIGHTS,
        parse_weights,
        read_checked_weights,
    )
    from capsmed.train.run_config import training_unfinished

    source = Path(source)
    path = source / WEIGHTS
    late = training_unfinished(source)
    if late is not None:  # its checkpoint is of an intermediate epoch
        raise CapsmedError(f"{source}: its training has not finished ({late.reason}), so "
                           "it would lend the layers of an intermediate epoch; "
                           f"{late.then('transfer')}")
    if not path.is_file() or not (source / META).is_file():
        raise CapsmedError(f"{path}: no checkpoint to transfer from")
    meta = _source_meta(source / META)
    blob, digest = read_checked_weights(path, meta.get("weights_digest"))  # read once
    if meta.get("arch") != arch:  # same names and shapes need not mean the same layers
        raise CapsmedError(f"{source}: a run of architecture '{meta.get('arch')}'; layers "
                           f"transfer between runs of the same architecture ('{arch}')")
    weights = parse_weights(blob, path)
    params = dict(model.named_parameters())
    ours = model.state_dict()  # parameters and their layers' buffers
    theirs = meta.get("class_names")
    by_class = (class_layer(model, arch, model_kwargs) if isinstance(theirs, list)
                and classes is not None and model_kwargs is not None
                and list(theirs) != list(classes) else set())
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
        if layer & by_class:
            raise CapsmedError(class_layer_refusal(source, prefix, by_class, theirs, classes)
                               + ": leave the class layer out of --transfer-layers")
        for name in names:
            with torch.no_grad():
                params[name].copy_(weights[name])
            copied.append(name)
        for name, buffer in model.named_buffers():  # batch norms' running statistics
            if inside(name) and name in weights:
                with torch.no_grad():
                    buffer.copy_(weights[name])
    keep_transferred(model, prefixes, freeze)
    if freeze and not any(p.requires_grad for p in model.parameters()):
        raise CapsmedError(f"transfer layers {', '.join(prefixes)}: they are all of the "
                           "model's parameters, frozen, so nothing would be trained; leave "
                           "the last layers out of --transfer-layers, or pass "
                           "--no-freeze-transferred")
    log.info("transferred %d parameter tensors from %s%s", len(copied), source,
             " (frozen)" if freeze else "")
    return {"run": str(source.resolve()), "epoch": meta.get("epoch"),
            "weights_digest": digest}


def keep_transferred(model: torch.nn.Module, prefixes: list[str], freeze: bool) -> None:
    """Train or freeze the transferred layers as asked (with their batch norms'
    statistics when frozen): what :func:`transfer_parameters` does beside copying, and
    all a resumed transfer run redoes (its ``resume.pt`` holds the copied weights)."""
    for name, param in model.named_parameters():
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            param.requires_grad_(not freeze)
    if freeze:
        _freeze_norm_statistics(model, prefixes)


def recorded_transfer(run_dir: Path) -> dict[str, Any] | None:
    """What the run's ``config.yaml`` records of its source when it holds the digest of
    the weights copied (runs before that record: None, their source is read again)."""
    from capsmed.train.run_config import read_run_config

    recorded = read_run_config(run_dir).get("transfer")
    if isinstance(recorded, dict) and isinstance(recorded.get("weights_digest"), str):
        return recorded
    return None


def class_layer(model: torch.nn.Module, arch: str, model_kwargs: dict[str, Any]) -> set[str]:
    """The names of the model's class layer (parameters and buffers): the last layer,
    the decoder aside, whose shape follows the number of classes (its rows score the
    classes in their order). Found by building the model on the meta device (no memory,
    the seeded global generator untouched) with one class more and comparing shapes."""
    from capsmed.models import create_model

    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    count = int(model_kwargs["num_classes"])
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            probe = create_model(arch, **{**model_kwargs, "num_classes": count + 1})
        more = {k: tuple(v.shape) for k, v in probe.state_dict().items()}
        by_class = [k for k, shape in ours.items() if more.get(k) != shape]
    except Exception:  # noqa: BLE001 (every capsmed model builds with a class more;
        # else: the tensors with a dimension of the number of classes)
        by_class = [k for k, shape in ours.items() if count in shape]
    by_class = [k for k in by_class if not k.startswith("decoder.")]
    if not by_class:
        return set()
    owner = by_class[-1].rpartition(".")[0]
    return {k for k in by_class if k.rpartition(".")[0] == owner}


def class_layer_refusal(source: Path | str, prefix: str, names: set[str], theirs: Any,
                        ours: Any, whose: str = "this run's") -> str:
    """One line (to be ended by what to do): layer ``prefix`` holds the class layer
    ``names`` (:func:`class_layer`), and the classes ``theirs`` and ``ours`` differ."""
    owner = sorted(names)[0].rpartition(".")[0]
    order = " (the same classes in another order)" if sorted(theirs) == sorted(ours) else ""
    return (f"{source}: layer '{prefix}' holds its class layer '{owner}', which scores the "
            f"classes {list(theirs)} in that order; {whose} are {list(ours)}{order}, so "
            "a copy would give one class's scores to another")


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
