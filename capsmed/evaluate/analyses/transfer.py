"""Layer transfer, AnB / BnB (paper 003 section 3.3, Fig. 7; Yosinski et al. 2014).

Base networks are trained on task A and on task B. For each k, "AnB" keeps the first k
layers of A's network, frozen, re-initialises the rest and trains it on B; the control
"BnB" does the same starting from B's own network. Both are tested on B's test split,
beside the base B network (plain supervised learning on B). BnB shows whether the
lower layers can be decoupled from the upper ones they were trained with; AnB whether
they also carry over to another task.

Layers: by default the modules that own parameters, in ``named_parameters`` order
(normalisation layers join the layer before them; the reconstruction ``decoder``, not
on the path to the class scores, is never transferred and always trained afresh), and
k runs from 1 to one less than their number, so the class layer is always retrained.
For CapsNet that is ``conv.0``, ``primary.conv`` | ``classes``: A1B and A2B, as in
paper 003. ``layers`` overrides the list (each item a parameter-name prefix, or several
joined by ``+``) and k then runs over all of it; give it for networks with parallel
paths, whose parameter order lists one path after another: the branches of
``parallel-*``, the shortcut projections of residual networks (there, whole blocks or
stages make sensible layers, e.g. ``stem,stages.0,stages.1``).

Other choices: the transferred stack includes the source network's input
standardisation (its ``input_mean``/``input_std``: ``capsmed train --transfer-from``
takes it), so frozen layers see inputs scaled as when they were trained; the
re-initialised layers of every AnB / BnB run use seed ``seed + 1``, so AnB and BnB at
the same k start from the same upper weights and none replays its base network's
initialisation. Frozen batch-norm layers (ResNeXt stems) keep their transferred running
statistics (eval mode), as the trainer freezes them.
Finished runs under ``out`` are reused when their options match, and interrupted ones
resumed, so a long protocol can be restarted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from capsmed.data.contract import (
    SECOND_LABEL,
    checked_second_labels,
    is_two_label,
    read_info,
    read_labels,
    read_meta,
)
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses import common
from capsmed.figures import plain, pyplot, save_figure
from capsmed.train.run_data import TEST_ROWS
from capsmed.yamlfile import read_yaml

log = logging.getLogger(__name__)

NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2d)
DATA_KWARGS = ("in_channels", "num_classes", "input_size", "input_mean", "input_std")
PROTOCOL_OPTIONS = ("data", "arch", "out", "transfer_from", "transfer_layers",
                    "freeze_transferred", "fold", "folds")


@dataclass(frozen=True)
class TransferConfig:
    """The AnB / BnB protocol's inputs (recorded in ``transfer.json``).

    Attributes:
        a, b: Dataset files of tasks A and B (same channels and image size).
        out: Folder for the base and transfer runs and ``analysis/transfer/``.
        arch: Architecture (optional when both base runs are given).
        layers: Ordered layer prefixes (``+`` joins several); None = derived.
        base_a, base_b: Existing run directories to use as the base networks.
        train_options: Training options for every run (epochs, batch_size, lr, seed,
            model_kwargs, ...; the protocol sets data, arch, out and the transfer).
    """

    a: str
    b: str
    out: str
    arch: str | None = None
    layers: tuple[str, ...] | None = None
    base_a: str | None = None
    base_b: str | None = None
    train_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = sorted(set(self.train_options) & set(PROTOCOL_OPTIONS))
        if clash:
            raise CapsmedError(f"the transfer protocol sets {', '.join(clash)} itself")
        if self.arch is None and self.base_a is None and self.base_b is None:
            raise CapsmedError("give --arch, or base runs (--base-a / --base-b)")
        if self.layers is not None and not self.layers:
            raise CapsmedError("--layers is empty")


def transferable_layers(model: nn.Module) -> list[tuple[str, ...]]:
    """Ordered layers of ``model``, each a tuple of parameter-name prefixes."""
    modules = dict(model.named_modules())
    layers: list[list[str]] = []
    for name, _ in model.named_parameters():
        owner = name.rpartition(".")[0] or name  # a top-level parameter is its own layer
        if owner.split(".")[0] == "decoder" or (layers and owner in layers[-1]):
            continue
        if layers and isinstance(modules.get(owner), NORMS):
            layers[-1].append(owner)
        else:
            layers.append([owner])
    return [tuple(group) for group in layers]


def _meta(run_dir: Path) -> dict[str, Any]:
    from capsmed.runs.checkpoint import checkpoint_meta

    return checkpoint_meta(run_dir)


def _model_options(meta: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's architecture options without those the data sets."""
    return {k: v for k, v in meta["model_kwargs"].items() if k not in DATA_KWARGS}


def _normalised(values: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(yaml.safe_dump(values))  # tuples -> lists, as config.yaml holds


def _check_trained_on(run_dir: Path, data: Path, what: str) -> None:
    """Refuse a run that was not trained on ``data``'s content: by the digest its
    config.yaml recorded (its path, for runs from before digests)."""
    from capsmed.data.digest import file_digest

    config_path = Path(run_dir) / "config.yaml"
    config = (read_yaml(config_path)
              if config_path.is_file() else {}) or {}
    saved = (config.get("dataset") or {}).get("digest")
    trained = (config.get("train") or {}).get("data") or _meta(run_dir).get("data")
    same = (saved == file_digest(data) if saved else
            trained is not None and Path(trained).resolve() == data.resolve())
    if not same:
        raise CapsmedError(f"{run_dir}: was not trained on {what} {data} (trained on "
                           f"{trained}{', whose content differs' if saved else ''}); "
                           "pass a run trained on it, or remove it to train one")


def _check_finished(run_dir: Path, what: str) -> None:
    """Refuse a base run whose training has not finished: its checkpoint is of an
    intermediate epoch, and the layers it lends would change when it is resumed."""
    from capsmed.train.run_config import training_unfinished

    late = training_unfinished(Path(run_dir))
    if late is not None:
        raise CapsmedError(f"{run_dir}: its training has not finished ({late.reason}), so "
                           f"{what} would lend the layers of an intermediate epoch; "
                           f"{late.then('analyze transfer')}")


def _check_same_source(run_dir: Path, source: Path, prefixes: list[str]) -> None:
    """Refuse to reuse a transfer run whose frozen layers are not its source's current
    weights (the source was resumed or retrained since they were copied)."""
    from safetensors.torch import load_file

    from capsmed.train.run_config import WEIGHTS

    if not (run_dir / WEIGHTS).is_file() or not (source / WEIGHTS).is_file():
        return  # no checkpoint yet (resumed from its first epoch) or the source is gone
    ours, theirs = load_file(str(run_dir / WEIGHTS)), load_file(str(source / WEIGHTS))
    stale = [name for name, value in ours.items()
             if any(name == p or name.startswith(p + ".") for p in prefixes)
             and name in theirs and not torch.equal(value, theirs[name])]
    if stale:
        raise CapsmedError(f"{run_dir}: its frozen layers ({stale[0]}, ...) differ from "
                           f"{source}'s checkpoint, which changed since they were copied; "
                           "remove it to train it again from the current one")


def train_or_reuse(cfg: Any, disable_progress: bool | None) -> Path:
    """Train ``cfg`` (a TrainConfig) unless its run directory already holds the same
    finished run (reused) or an interrupted one (resumed); a transfer run only while
    its frozen layers are still its source's weights."""
    from capsmed.train.engine import resume, train

    out = Path(cfg.out)
    config_path = out / "config.yaml"
    if config_path.is_file():
        saved = read_yaml(config_path)["train"]
        ours = _normalised(cfg.resolved(read_info(Path(cfg.data)).image_domain()).to_dict())
        same = (Path(saved["data"]).resolve() == Path(cfg.data).resolve()
                and all(saved.get(k) == v for k, v in ours.items()
                        if k not in ("data", "out")))
        if not same:
            raise CapsmedError(f"{out}: holds a run with other options; choose another "
                               "--out or remove it")
        _check_trained_on(out, Path(cfg.data), "its data")
        if cfg.transfer_from and cfg.freeze_transferred:
            _check_same_source(out, Path(cfg.transfer_from), list(cfg.transfer_layers))
        # resume.pt beside summary.json: killed while it finished (--resume ends it)
        if (out / "resume.pt").is_file():
            return resume(out, disable_progress=disable_progress)
        if (out / "summary.json").is_file():
            log.info("reusing the finished run %s", out)
            return out
    return train(cfg, disable_progress=disable_progress)


def _check_model_args(asked: dict[str, Any], bases: dict[str, tuple[Path, dict[str, Any]]],
                      arch: str) -> None:
    """Refuse architecture options that a given base run was not trained with: every
    transfer run takes its base network's options, so they would apply to no run (and
    transfer.json would record them as if they had)."""
    from capsmed.models.registry import get_model_entry

    defaults = get_model_entry(arch).defaults()
    for task, (run, meta) in bases.items():
        kept = {**defaults, **_model_options(meta)}
        for key, value in asked.items():
            if key not in kept:
                raise CapsmedError(f"--model-arg {key}: architecture '{arch}' has no such "
                                   "option")
            want = defaults.get(key) if value is None else value
            if _normalised({key: want}) != _normalised({key: kept[key]}):
                raise CapsmedError(f"--model-arg {key}={value}: --base-{task.lower()} {run} "
                                   f"was trained with {key}={kept[key]}; the transfer runs "
                                   "take their base network's options, so drop it or pass a "
                                   "base run trained with it")


def _split_layers(items: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [tuple(p.strip() for p in item.split("+") if p.strip()) for item in items]


def _check_layers(model: nn.Module, layers: list[tuple[str, ...]]) -> None:
    names = [n for n, _ in model.named_parameters()]
    given = [p for layer in layers for p in layer]
    for i, prefix in enumerate(given):  # A(k+1)B would transfer what AkB did
        other = next((q for q in given[:i] if q == prefix or prefix.startswith(q + ".")
                      or q.startswith(prefix + ".")), None)
        if other is not None:
            raise CapsmedError(f"--layers: '{prefix}' is given twice (or covers, or is "
                               f"covered by, '{other}'); name each layer once")
    for layer in layers:
        for prefix in layer:
            if not any(n == prefix or n.startswith(prefix + ".") for n in names):
                derived = ", ".join("+".join(g) for g in transferable_layers(model))
                raise CapsmedError(f"layer '{prefix}' matches no parameter of the model "
                                   f"(its layers: {derived})")


def _check_class_layer(probe: nn.Module, arch: str, options: dict[str, Any],
                       layers: list[tuple[str, ...]], cfg: TransferConfig, info_a: Any,
                       info_b: Any) -> None:
    """Refuse, before any training, a class layer among the layers when A's classes are
    not B's (others, or the same in another order): AnB would score B's classes with
    A's class rows (capsmed train refuses it too, but only once the base runs and the
    lower AkB runs are trained)."""
    from capsmed.train.transfer import class_layer, class_layer_refusal

    if list(info_a.class_names) == list(info_b.class_names):
        return
    held = class_layer(probe, arch, {"in_channels": info_b.channels,
                                     "num_classes": info_b.num_classes,
                                     "input_size": list(info_b.image_size), **options})
    for prefix in (p for layer in layers for p in layer):
        if any(n == prefix or n.startswith(prefix + ".") for n in held):
            raise CapsmedError(class_layer_refusal(
                cfg.a, prefix, held, info_a.class_names, info_b.class_names,
                whose=f"{cfg.b}'s") + ": leave it out of --layers")


def _accuracy(run_dir: Path, data: Path, batch_size: int, device: str) -> float:
    from capsmed.runs import open_run

    run = open_run(run_dir, data, device)
    model, dev, samples = run.model, run.device, run.samples("test")
    if not is_two_label(data, "test"):
        return common.accuracy(common.predict(model, samples.images, dev, batch_size),
                               samples.labels)
    # two digits per image (paper 003 s3.3's multi-MNIST tasks): both in the top two
    if (run_dir / TEST_ROWS).is_file():
        raise CapsmedError(f"{data}: a two-label file with cross-validation folds is not "
                           "supported by analyze transfer")
    second = checked_second_labels(samples.labels, read_meta(data, "test", SECOND_LABEL),
                                          len(run.class_names), data, "test")
    both, _, _ = common.two_digit_hits(
        common.class_scores(model, samples.images, dev, batch_size), samples.labels, second)
    return float(both.mean()) if len(both) else 0.0


def _check_second_labels(path: Path, info: Any) -> None:
    """Refuse, before any training, a two-label test split that two-digit accuracy
    cannot score (a label given twice, or outside the classes)."""
    if "test" in info.split_sizes and is_two_label(path, "test"):
        labels, _ = read_labels(path, "test")
        checked_second_labels(labels, read_meta(path, "test", SECOND_LABEL),
                                     info.num_classes, path, "test")


def run_transfer(cfg: TransferConfig, disable_progress: bool | None = None
                 ) -> tuple[dict[str, Any], Path]:
    """Paper 003's AnB / BnB protocol; returns the record and ``out/analysis/transfer``."""
    from capsmed.models import create_model
    from capsmed.train.config import TrainConfig

    out = Path(cfg.out)
    info_a, info_b = read_info(Path(cfg.a)), read_info(Path(cfg.b))
    if (info_a.channels, *info_a.image_size) != (info_b.channels, *info_b.image_size):
        raise CapsmedError(f"{cfg.b}: images are {info_b.channels}x{info_b.image_size[0]}x"
                           f"{info_b.image_size[1]}, task A's ({cfg.a}) are "
                           f"{info_a.channels}x{info_a.image_size[0]}x{info_a.image_size[1]}; "
                           "layers transfer only between inputs of one shape")
    for path, info in ((Path(cfg.a), info_a), (Path(cfg.b), info_b)):
        _check_second_labels(path, info)
    options = dict(cfg.train_options)
    seed = int(options.pop("seed", 0))
    given = {t: Path(r) for t, r in (("A", cfg.base_a), ("B", cfg.base_b)) if r is not None}
    for task, run in given.items():  # "base B" must be a network trained on B
        _check_trained_on(run, Path(cfg.a if task == "A" else cfg.b), f"--{task.lower()}")
        _check_finished(run, f"--base-{task.lower()}")
    bases = {t: (r, _meta(r)) for t, r in given.items()}
    archs = {meta["arch"] for _, meta in bases.values()} | ({cfg.arch} if cfg.arch else set())
    if len(archs) > 1:
        raise CapsmedError(f"the base runs and --arch name different architectures "
                           f"({', '.join(sorted(archs))})")
    arch = archs.pop()
    _check_model_args(options.get("model_kwargs") or {}, bases, arch)
    # The layers are checked on a model like the ones to come, before any training.
    probe_kwargs = (_model_options(next(iter(bases.values()))[1]) if bases
                    else options.get("model_kwargs", {}))
    probe = create_model(arch, in_channels=info_b.channels, num_classes=info_b.num_classes,
                         input_size=list(info_b.image_size), **probe_kwargs)
    if cfg.layers is None:
        if not getattr(probe, "layers_in_order", True):
            raise CapsmedError(f"'{arch}' has residual shortcuts or parallel branches, so "
                               "its parameter order is not its layer order; name the layers "
                               "with --layers (e.g. --layers stem,...; the docs list them)")
        layers = transferable_layers(probe)[:-1]
    else:
        layers = _split_layers(cfg.layers)
        _check_layers(probe, layers)
    if not layers:
        raise CapsmedError(f"'{arch}' has a single layer: nothing to transfer")
    _check_class_layer(probe, arch, probe_kwargs, layers, cfg, info_a, info_b)
    del probe
    for task, data in (("A", cfg.a), ("B", cfg.b)):
        if task not in bases:
            run = train_or_reuse(TrainConfig(data=str(data), arch=arch, seed=seed,
                                             out=str(out / f"base-{task}"), **options),
                                 disable_progress)
            bases[task] = (run, _meta(run))
    kwargs = {t: _model_options(m) for t, (_, m) in bases.items()}
    if _normalised(kwargs["A"]) != _normalised(kwargs["B"]):
        raise CapsmedError(f"{bases['A'][0]} and {bases['B'][0]} have different model "
                           f"options ({kwargs['A']} vs {kwargs['B']})")

    eval_bs = int(options.get("eval_batch_size", 512))
    device = str(options.get("device", "auto"))
    rows = [{"scheme": "base B", "k": 0, "layers": "", "run": str(bases["B"][0]),
             "accuracy": _accuracy(bases["B"][0], Path(cfg.b), eval_bs, device)}]
    for k in range(1, len(layers) + 1):
        prefixes = [p for layer in layers[:k] for p in layer]
        for task in ("A", "B"):
            source, _ = bases[task]
            name = f"{task}{k}B"
            run = train_or_reuse(TrainConfig(  # its standardisation is the source's
                data=str(cfg.b), arch=arch, seed=seed + 1, out=str(out / name),
                transfer_from=str(source), transfer_layers=prefixes,
                freeze_transferred=True, **{**options, "model_kwargs": kwargs[task]}),
                disable_progress)
            rows.append({"scheme": f"{task}nB", "k": k, "layers": " ".join(prefixes),
                         "run": str(run), "accuracy": _accuracy(run, Path(cfg.b), eval_bs,
                                                                device)})
    base_a_acc = _accuracy(bases["A"][0], Path(cfg.a), eval_bs, device)
    record = {"a": str(cfg.a), "b": str(cfg.b), "arch": arch,
              "layers": ["+".join(layer) for layer in layers],
              "base_a": str(bases["A"][0]), "base_b": str(bases["B"][0]),
              "base_a_accuracy_on_a": base_a_acc, "seed": seed, "transfer_seed": seed + 1,
              "train_options": options, "results": rows}
    folder = common.analysis_dir(out, "transfer")
    common.write_json(folder / "transfer.json", record)
    common.write_csv(folder / "transfer.csv", ["scheme", "k", "layers", "accuracy", "run"],
                     [[r["scheme"], r["k"], r["layers"], r["accuracy"], r["run"]]
                      for r in rows])
    _plot(rows, f"{arch}: layers from A or B kept frozen, the rest retrained on B",
          folder / "transfer.png")
    return record, folder


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    base = rows[0]["accuracy"]
    ks = sorted({r["k"] for r in rows if r["k"] > 0})
    ax.axhline(base, color="grey", linestyle="--", label="base B (trained on B)")
    ax.scatter([0], [base], color="grey", zorder=3)
    for scheme, colour, marker in (("BnB", "tab:blue", "o"), ("AnB", "tab:red", "s")):
        acc = [next(r["accuracy"] for r in rows if r["scheme"] == scheme and r["k"] == k)
               for k in ks]
        ax.plot(ks, acc, color=colour, marker=marker, label=scheme)
    ax.set_xticks([0, *ks], ["base", *[str(k) for k in ks]])
    ax.set_xlabel("layers kept frozen (k)")
    ax.set_ylabel("accuracy on B's test split")
    ax.set_ylim(max(0.0, float(np.min([r["accuracy"] for r in rows])) - 0.1), 1.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{plain(title)}\n(paper 003 Fig. 7)", fontsize=9)
    save_figure(fig, path)
