"""What a run's protocol is, and what only tells its repetitions apart: one place.

A run's ``train`` options (:class:`~capsmed.train.config.TrainConfig`) fall in three
kinds:

* **protocol**: the data-challenge setting the papers vary (fraction, imbalance,
  augmentation, sampler, class weights, cross-validation, per-class limit, layer
  transfer). Runs of one dataset and architecture with the same protocol are
  repetitions of one experiment; ``capsmed report`` averages them.
* **repetition**: what tells repetitions apart or only changes how fast a run goes
  (seed, fold, device, precision of the loader...).
* everything else (lr, epochs, model options): the same within a group; ``capsmed
  report`` warns when a group mixes them.

``capsmed runs ls``, ``capsmed report`` and ``capsmed run`` (pipelines) all label and
group runs through :func:`protocol_settings` and :func:`protocol_label`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from capsmed.train.config import TrainConfig

# Options that change where a run goes, how fast, or what it reports to, never what it
# computes: neither a run's identity (capsmed run) nor a resumed run's check of its
# options (resume.pt) counts them.
SESSION_OPTIONS = frozenset({"out", "device", "data_loading", "loader_workers",
                             "tensorboard", "compile", "cuda_graph", "channels_last",
                             "eval_batch_size", "state_every_minutes", "mlflow",
                             "mlflow_experiment", "wandb"})

# What a run with the same options and data computes. Bumped by any change after which
# such a run trains or scores differently, so that `capsmed run` (whose run identity
# holds it) trains it again instead of taking the older run as finished, and `capsmed
# report` warns when it averages runs of two revisions.
#   0: runs made before capsmed recorded a revision.
#   1 (2026-11-22): --per-class-limit with --fold spreads the limit over the folds;
#     rotating non-square images no longer shears them; augment_recipe implies
#     augment; fold runs keep and report their last epoch; torchrun ranks draw
#     per-sample augmentation shares; layer transfer copies batch-norm statistics.
#   2 (2026-11-24): defaults follow the image domain a file records, not its name: a
#     class-folder or slide set (generic unless --domain) trains at lr 1e-4 and
#     reconstruction weight 5e-5, and --augment only rotates it (it was flipped).
#   3 (2026-11-27): frozen transferred layers keep their batch norms in eval mode and
#     --transfer-from standardises inputs as the source run did; --per-class-limit
#     without folds trains one pass over what it keeps, and a fraction on top of it as
#     many steps as one pass over the limited set (as with folds).
#   4 (2026-11-27): under torchrun each rank's loss is weighed by its share of the
#     batch (uneven shares were averaged evenly; an empty one stopped the run as NaN),
#     a partial epoch's resumed sums are every rank's, and BatchNorm models validate
#     with rank 0's statistics (those of the checkpoint it writes).
#   5 (2026-11-28): an augmentation's translation is no longer rotated with the image
#     (rotation=45,translation=0.1 moved content up to 0.14 of the side along an axis).
#   6 (2026-11-28): two-label training with an unmasked decoder (reconstruction=plain,
#     convnet-r) compares its one reconstruction with the whole input, both objects
#     (it was scored against each object's image in turn, learning their average).
PROTOCOL_REVISION = 6

PROTOCOL_FIELDS = ("fraction", "imbalance", "augment", "augment_recipe", "sampler",
                   "class_weights", "folds", "per_class_limit", "transfer_layers",
                   "freeze_transferred")
REPETITION_KEYS = frozenset({"seed", "fold", "out", "data", "device", "eval_batch_size",
                             "channels_last", "compile", "data_loading", "loader_workers",
                             "tensorboard", "transfer_from", "state_every_minutes",
                             "cuda_graph", "mlflow", "mlflow_experiment",
                             "wandb"})


def _defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in PROTOCOL_FIELDS:
            out[f.name] = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                           else f.default)
    return out


# A run whose config.yaml predates a key has the dataclass default for it.
PROTOCOL_DEFAULTS: dict[str, Any] = _defaults()


def transfer_source(train: dict[str, Any]) -> str | None:
    """What a transfer run's layers were trained as: ``<arch> on <dataset>`` from the
    source run's ``config.yaml`` (its folder name when that is unreadable), so runs
    transferred from different sources are not averaged as repetitions of one."""
    source = train.get("transfer_from")
    if not source or not train.get("transfer_layers"):
        return None
    from capsmed.yamlfile import read_yaml

    try:
        config = read_yaml(Path(source) / "config.yaml")
        arch = (config.get("train") or {}).get("arch")
        dataset = (config.get("dataset") or {}).get("name")
    except Exception:  # gone or damaged: the folder still tells sources apart
        return Path(str(source)).name
    return f"{arch} on {dataset}" if arch and dataset else Path(str(source)).name


def protocol_settings(train: dict[str, Any], source: str | None = None,
                      file_folds: int | None = None) -> dict[str, Any]:
    """The protocol of a run's ``train`` options, normalised so equal protocols compare
    equal (missing keys defaulted, a fraction of 1 is the whole split, ...); ``source``
    is what transferred layers came from (:func:`transfer_source`); ``file_folds`` the
    number of folds of the file a cross-validation run was trained on (config.yaml's
    ``dataset.folds``): ``--fold 1`` and ``--fold 1 --folds 5`` are one protocol."""
    s = {key: train.get(key, default) for key, default in PROTOCOL_DEFAULTS.items()}
    if train.get("fold") is not None and s["folds"] is None and file_folds is not None:
        s["folds"] = int(file_folds)
    if s["fraction"] is not None and float(s["fraction"]) == 1.0:
        s["fraction"] = None  # the whole split, whichever way it was written
    s["imbalance"] = {k: float(v) for k, v in sorted((s["imbalance"] or {}).items())}
    s["augment"] = bool(s["augment"])
    if not s["augment"]:
        s["augment_recipe"] = None  # a recipe without augmentation changes nothing
    s["transfer_layers"] = list(s["transfer_layers"] or [])
    if not s["transfer_layers"]:
        s["freeze_transferred"] = PROTOCOL_DEFAULTS["freeze_transferred"]
    elif source is not None:
        s["transfer_source"] = source
    s["cv"] = train.get("fold") is not None  # folds (k) is optional beside fold
    return s


def protocol_label(settings: dict[str, Any]) -> str:
    """A readable protocol name, e.g. ``fraction 0.1, augment paper000-medical``."""
    parts = []
    if settings.get("fraction") is not None:
        parts.append(f"fraction {settings['fraction']:g}")
    for name, pct in (settings.get("imbalance") or {}).items():
        parts.append(f"{name} {pct:g}%")
    if settings.get("augment"):
        parts.append(f"augment {settings.get('augment_recipe') or 'default'}")
    if settings.get("sampler", "shuffle") != "shuffle":
        parts.append(f"{settings['sampler']} batches")
    if settings.get("class_weights"):
        parts.append(f"{settings['class_weights']} class weights")
    if settings.get("per_class_limit") is not None:
        parts.append(f"per-class limit {settings['per_class_limit']}")
    if settings.get("folds") is not None or settings.get("cv"):
        parts.append(f"{settings['folds']}-fold CV" if settings.get("folds") else "CV")
    if settings.get("transfer_layers"):
        frozen = "frozen" if settings.get("freeze_transferred", True) else "fine-tuned"
        source = (f" from {settings['transfer_source']}" if settings.get("transfer_source")
                  else "")
        parts.append(f"transferred {'+'.join(settings['transfer_layers'])}{source} "
                     f"({frozen})")
    return ", ".join(parts) or "full"


def protocol_sort_key(settings: dict[str, Any]) -> tuple:
    """Paper 000's column order: growing training fraction, the full set, then the rest."""
    fraction = settings.get("fraction")
    label = protocol_label(settings)
    return (1.0 if fraction is None else float(fraction), label != "full", label)
