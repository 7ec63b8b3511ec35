"""Training configuration: a frozen dataclass, loadable from YAML, unknown keys rejected."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capsmed.data.challenges import DataChallenge
from capsmed.data.domains import Domain
from capsmed.data.loading import LOADINGS
from capsmed.errors import CapsmedError
from capsmed.train.choices import (
    FROM_DATA,
    OPTIMIZERS,
    PRECISIONS,
    SAMPLERS,
    SCHEDULES,
)
from capsmed.yamlfile import read_yaml

SABOUR_LR_DECAY = 0.96  # the exponential schedule's default factor per epoch


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; the resolved copy is saved as ``config.yaml``.

    Attributes:
        data: Dataset ``.h5`` file (the contract).
        arch: Registered architecture name.
        epochs: Passes over the training split.
        batch_size: Training batch size (paper: 128).
        lr: Adam learning rate; None = the default of the data's image domain (paper
            000: 1e-3 for digits, 1e-4 for the medical sets).
        recon_weight: Reconstruction loss weight; None = the domain's default.
        seed: Seed for initialisation and batch order.
        device: ``auto`` (CUDA, then MPS, then CPU) or a torch device string.
        out: Run directory; None = ``runs/<dataset>-<arch>-s<seed>-<UTC time>``.
        model_kwargs: Extra architecture options (e.g. reduced widths).
        eval_batch_size: Batch size for validation and evaluation.
        standardize: Standardise inputs with the training split's per-channel mean
            and std (stored in the model's arguments). Without it the paper CapsNet
            barely learns on dark-on-bright histology patches in a few hundred steps.
        fraction: Train on this share of the training split, per class (paper 000).
        imbalance: ``{class: percent kept}`` reductions (paper 000 section 3.2).
        steps_per_epoch: Batches per epoch; None = one pass, or, under a fraction or
            imbalance protocol, as many steps as one pass over the full split, after any
            per-class limit (paper 000 trains subsets for the same number of
            iterations). Paper 001: 500.
        sampler: ``shuffle`` or ``balanced`` (same count of every class per batch,
            paper 001).
        patience: Stop when validation loss has not improved for this many epochs
            (paper 000: 20); None never stops early.
        optimizer: ``adam`` (papers 000, 004) or ``nadam`` (paper 001).
        lr_schedule: ``constant`` or ``exponential`` (multiplied by ``lr_decay`` per epoch).
        lr_decay: The exponential schedule's factor per epoch (Sabour et al.: 0.96).
        class_weights: ``balanced`` weights each sample's loss by N / (K n_c) of its
            class in the training samples used; None = unweighted.
        augment: Augment training batches on the device.
        augment_recipe: A recipe of :mod:`capsmed.train.augment` (paper 000 medical /
            MNIST / Fashion-MNIST, paper 001) or a spec such as
            ``rotation=15,translation=0.1,hflip``; a recipe implies ``augment``; None =
            the recipe of the data's image domain (digits are never flipped, generic
            sets only rotated).
        fold: Cross-validation: test on this fold of a file written with folds, train
            on the others (paper 001).
        folds: Expected number of folds (checked against the file).
        per_class_limit: At most this many samples per class (paper 001's small-data
            protocol; with ``fold``, the rest of each class goes to the test set).
        precision: ``auto`` (bf16 autocast on GPUs that support it, fp16 with loss
            scaling on other GPUs, fp32 on CPU), ``fp32`` (IEEE: TF32 off), ``tf32``
            (fp32 tensors, TF32 matmuls and convolutions; CUDA, Ampere or newer),
            ``bf16`` or ``fp16``. Routing always runs in fp32.
        channels_last: Channels-last memory format; None = on CUDA only.
        compile: ``torch.compile`` the model (20-50 s start-up; pays off on long runs).
        cuda_graph: Replay the whole training step (forward, loss, backward, optimiser
            update, the epoch's sums) as one CUDA graph (CUDA only; not with fp16
            or torchrun; with ``augment`` the transforms are drawn before each replay).
        state_every_minutes: Write the resumable state at most this often (at a check
            point every 50 steps or an epoch end), besides at the start, at the end of
            training and when stopped; 0 = at every check point and epoch end.
        data_loading: ``memory`` (held on the device), ``stream`` (read from HDF5 per
            batch) or ``auto`` (stream when the set would take over a quarter of free
            GPU memory or 4 GiB of host memory).
        loader_workers: Reader processes when streaming.
        tensorboard: Also write TensorBoard event files to ``RUN_DIR/tensorboard``.
        mlflow: Track the run in MLflow: a tracking URI (``http://host:5000``,
            ``file:/path``, ``databricks``) or a local folder (an MLflow file store);
            needs ``capsmed[mlflow]``; None = not tracked.
        mlflow_experiment: The MLflow experiment the run is logged in; None = the
            dataset's name.
        wandb: Log the run to Weights & Biases in this project (needs
            ``capsmed[wandb]``; ``WANDB_MODE=offline`` logs locally, for ``wandb sync``
            later); None = not logged.
        transfer_from: A run directory whose checkpoint initialises the parameters
            named by ``transfer_layers`` (paper 003's AnB / BnB transfer).
        transfer_layers: Parameter-name prefixes copied from ``transfer_from`` (e.g.
            ``conv1``, ``primary``); required with it.
        freeze_transferred: Keep the copied parameters fixed while training (batch norms
            among them normalise with their copied running statistics, never updated).
    """

    data: str
    arch: str
    epochs: int = 50
    batch_size: int = 128
    lr: float | None = None
    recon_weight: float | None = None
    seed: int = 0
    device: str = "auto"
    out: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_batch_size: int = 512
    standardize: bool = True
    fraction: float | None = None
    imbalance: dict[str, float] = field(default_factory=dict)
    steps_per_epoch: int | None = None
    sampler: str = "shuffle"
    patience: int | None = 20
    optimizer: str = "adam"
    lr_schedule: str = "constant"
    lr_decay: float = SABOUR_LR_DECAY
    class_weights: str | None = None
    augment: bool = False
    augment_recipe: str | None = None
    fold: int | None = None
    folds: int | None = None
    per_class_limit: int | None = None
    precision: str = "auto"
    channels_last: bool | None = None
    compile: bool = False
    cuda_graph: bool = False
    state_every_minutes: float = 5.0
    data_loading: str = "auto"
    loader_workers: int = 2
    tensorboard: bool = False
    mlflow: str | None = None
    mlflow_experiment: str | None = None
    wandb: str | None = None
    transfer_from: str | None = None
    transfer_layers: list[str] = field(default_factory=list)
    freeze_transferred: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_option(f.name, getattr(self, f.name))
        # the standardisation may be given (layer transfer keeps its source's); these not
        from_data = sorted(set(self.model_kwargs) & (FROM_DATA - {"input_mean", "input_std"}))
        if from_data:
            raise CapsmedError(f"model option(s) {', '.join(from_data)} come from the data "
                               "file (its channels, classes and image size); drop them")
        if self.augment_recipe and not self.augment:  # as --augment-recipe: a recipe
            object.__setattr__(self, "augment", True)  # in a YAML alone was ignored
        self.challenge  # noqa: B018 -- validates fraction / imbalance / per-class limit
        if self.folds is not None and (self.folds < 2 or (self.fold or 0) >= self.folds):
            raise CapsmedError(f"folds must be >= 2 and above fold, got fold {self.fold} "
                               f"of {self.folds}")
        if self.lr_schedule == "constant" and self.lr_decay != SABOUR_LR_DECAY:
            raise CapsmedError(f"lr_decay {self.lr_decay} has no effect with the constant "
                               "schedule; add --lr-schedule exponential")
        if self.sampler == "balanced" and self.class_weights == "balanced":
            raise CapsmedError("sampler balanced and class_weights balanced each correct "
                               "the class imbalance: together a rare class weighs far more "
                               "than the others; use one of them")
        if (self.transfer_from is None) != (not self.transfer_layers):
            raise CapsmedError("transfer_from and transfer_layers go together (which run, "
                               "which parameter-name prefixes)")
        if not self.freeze_transferred and self.transfer_from is None:
            raise CapsmedError("freeze_transferred false has no effect without "
                               "transfer_from (nothing is transferred); drop it")
        if self.mlflow_experiment is not None and not self.mlflow:
            raise CapsmedError(f"mlflow_experiment {self.mlflow_experiment!r} has no effect "
                               "without mlflow (the run is not tracked); add --mlflow URI")

    @property
    def challenge(self) -> DataChallenge:
        return DataChallenge(self.fraction, dict(self.imbalance), self.per_class_limit)

    def resolved(self, domain: Domain) -> TrainConfig:
        """Fill the defaults that follow the data's recorded image domain (learning rate,
        reconstruction weight, augmentation recipe: :mod:`capsmed.data.domains`)."""
        return dataclasses.replace(
            self,
            lr=self.lr if self.lr is not None else domain.lr,
            recon_weight=(self.recon_weight if self.recon_weight is not None
                          else domain.recon_weight),
            augment_recipe=(self.augment_recipe if self.augment_recipe or not self.augment
                            else domain.augment_recipe),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def check_keys(cls, values: dict[str, Any], origin: str) -> None:
        """Reject option names this config does not have (typos fail loudly)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            hints = [f"{k} -> {_suggest(k, known)}" for k in unknown if _suggest(k, known)]
            hint = "; ".join(hints)
            raise CapsmedError(f"{origin}: unknown training option(s) {', '.join(unknown)}"
                               + (f" (did you mean: {hint})" if hint else ""))

    @classmethod
    def from_dict(cls, values: dict[str, Any], origin: str = "config") -> TrainConfig:
        cls.check_keys(values, origin)
        missing = [k for k in ("data", "arch") if not values.get(k)]
        if missing:
            raise CapsmedError(f"{origin}: missing required option(s) "
                               f"{', '.join(missing)} (give --{missing[0]})")
        if values.get("augment") is False and values.get("augment_recipe"):
            raise CapsmedError(f"{origin}: augment is off but augment_recipe "
                               f"{values['augment_recipe']!r} is set; drop one of them")
        try:
            return cls(**values)
        except CapsmedError as exc:
            raise CapsmedError(f"{origin}: {exc}") from None


def read_options_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping of training options (possibly partial), keys checked."""
    try:
        values = read_yaml(Path(path)) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CapsmedError(f"{path}: cannot read YAML config ({exc})") from exc
    except UnicodeDecodeError:  # a dataset .h5 or a checkpoint given by mistake
        raise CapsmedError(f"{path}: not a YAML config (not UTF-8 text)") from None
    if not isinstance(values, dict):
        raise CapsmedError(f"{path}: expected a mapping of training options")
    TrainConfig.check_keys(values, str(path))
    for name, value in values.items():  # each option alone: a partial file is fine
        try:
            check_option(name, value)
        except CapsmedError as exc:
            raise CapsmedError(f"{path}: {exc}") from None
    return values


# What each option must be beyond its type (the type comes from the annotation).
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "epochs": (lambda v: v >= 1, ">= 1"),
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "eval_batch_size": (lambda v: v >= 1, ">= 1"),
    "lr": (lambda v: v > 0, "> 0"),
    "recon_weight": (lambda v: v >= 0, ">= 0"),
    "steps_per_epoch": (lambda v: v >= 1, ">= 1"),
    "patience": (lambda v: v >= 1, ">= 1"),
    "lr_decay": (lambda v: 0 < v <= 1, "within (0, 1]"),
    "fold": (lambda v: v >= 0, ">= 0"),
    "seed": (lambda v: v >= 0, ">= 0"),
    "folds": (lambda v: v >= 2, ">= 2"),
    "loader_workers": (lambda v: v >= 0, ">= 0"),
    "state_every_minutes": (lambda v: v >= 0, ">= 0"),
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "sampler": SAMPLERS, "optimizer": OPTIMIZERS, "lr_schedule": SCHEDULES,
    "precision": PRECISIONS, "data_loading": LOADINGS, "class_weights": ("balanced",),
}


# YAML keys people copy from the command line's flags, and what the YAML calls them
_ALIASES = {"augment_spec": "augment_recipe", "branches": "model_kwargs: {branches: N}",
            "model_arg": "model_kwargs"}


def _suggest(key: str, known: set[str]) -> str | None:
    """The option ``key`` (a flag's spelling, or a typo) probably means."""
    plain = key.replace("-", "_")
    if plain in _ALIASES:
        return _ALIASES[plain]
    if plain in known:
        return plain
    close = difflib.get_close_matches(plain, known, n=1)
    return close[0] if close else None


def check_option(name: str, value: Any) -> None:
    """Refuse a value of the wrong type (YAML ``epochs: "three"``, ``standardize: "no"``),
    a non-finite number (``--lr nan``) or one out of range, naming the option.

    Raises:
        CapsmedError: ``"<option> must be <what>, got <value>"``.
    """
    hint = _hints()[name]
    if value is None and _allows_none(hint):
        return
    if not _fits(hint, value):
        number = _as_number(value) if isinstance(value, str) else None
        yaml_text = number is not None and _fits(hint, number)
        raise CapsmedError(f"{name} must be {_describe(hint)}, got {value!r}" + (
            f" (YAML reads {value} as text: write it with a point, e.g. 1.0e-4)"
            if yaml_text else ""))
    if name in _RULES and not _RULES[name][0](value):
        raise CapsmedError(f"{name} must be {_RULES[name][1]}, got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        choices = _CHOICES[name]
        what = (f"'{choices[0]}'" if len(choices) == 1 else f"one of {', '.join(choices)}"
                ) + (" or unset" if _allows_none(hint) else "")
        raise CapsmedError(f"{name} must be {what}, got {value!r}")
    if name == "augment_recipe":
        from capsmed.train.augment import get_recipe  # torch: only when there is one

        get_recipe(value)


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _allows_none(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of the annotated type; numbers must be finite."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(a, value) for a in args)
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value))
    if hint is str:
        return isinstance(value, str)
    if origin is dict:
        return isinstance(value, dict) and all(
            _fits(args[0], k) and _fits(args[1], v) for k, v in value.items())
    if origin is list:
        return isinstance(value, list | tuple) and all(_fits(args[0], v) for v in value)
    raise TypeError(f"no check for {hint}")  # a new kind of option: add its check


def _describe(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_describe(a) for a in args) + " or unset"
    if origin is dict:
        return f"a mapping of names to {_describe(args[1]).removeprefix('a ')}s" \
            if args[1] is not Any else "a mapping"
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ')}s"
    return {bool: "true or false", int: "an integer", float: "a finite number",
            str: "a string"}.get(hint, str(hint))
