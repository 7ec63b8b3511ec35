"""Routing coupling entropy (paper 003 section 3.1, Fig. 3).

For one sample, each lower capsule ``i`` spreads its output over the ``J`` capsules
above with coupling coefficients ``c_ij`` (a distribution over ``j``); paper 003 reads
the entropy ``H[P_i] = -sum_j c_ij log c_ij`` as the uncertainty of the routing step,
and averages it over samples and lower capsules. Its printed formula has two forms,
``1/(N I) sum_n sum_i H`` and ``-1/(N I J) sum_n sum_i sum_j c log c``, which differ by a
factor ``J``; the first is the stated "average over every sample n and every low-layer
capsule i", and it is what the trainer logs per epoch as ``routing_entropy`` (nats, on
the validation split) and what this module computes. It is also given divided by
``log J`` (normalised: 1 = uniform couplings, 0 = every lower capsule routed to one
capsule), which compares layers and models with different ``J``.

Outputs (``RUN_DIR/analysis/routing/``): the entropy per epoch (Fig. 3a) and against
validation accuracy (Fig. 3b: one curve per run, markers darker as training goes on,
grey lines joining runs at the same epoch), and the kept checkpoint's entropy on the
test split, overall and per true class. The models report the couplings of one
routing layer, the one feeding the class capsules (paper 003 uses its first routing
operator, which is the same layer in a CapsNet with one routed layer); capsmed's
capsule networks with several routed layers (``parallel-dr capsule_layers=4``) do not
return the inner ones, so "per layer" here is that one layer, named in the output.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from capsmed.data.contract import SECOND_LABEL, checked_second_labels
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses import common
from capsmed.figures import plain, pyplot, save_figure

log = logging.getLogger(__name__)


@dataclass
class RoutingResult:
    """One run's routing entropy over training and on the test split.

    Attributes:
        run_dir, arch: The run.
        layer: The routing layer whose couplings the model reports.
        lower_capsules, upper_capsules: ``I`` and ``J`` of that layer.
        curve: Per epoch: ``epoch``, ``routing_entropy`` (nats), ``normalised``, ``val_acc``.
        test_entropy, test_normalised: Mean over test samples and lower capsules.
        per_class: ``{class: {"entropy", "normalised", "samples"}}`` by true class (a
            two-digit image counts for both its classes).
        samples: Test samples.
        by_iterations: The kept checkpoint rerun with other routing iteration counts
            (:data:`SWEEP`; the trained count marked ``trained``): ``iterations``,
            ``accuracy``, ``entropy``, ``normalised`` and ``agreement``, the share of
            test images given the trained count's class.
        two_label: The split holds two digits per image (MultiMNIST): ``accuracy`` is
            the two-digit accuracy (both digits in the top two, as ``analyze
            multimnist``) and ``agreement`` compares the top two classes.
    """

    run_dir: str
    arch: str
    layer: str
    lower_capsules: int
    upper_capsules: int
    curve: list[dict[str, float]]
    test_entropy: float
    test_normalised: float
    per_class: dict[str, dict[str, float]]
    samples: int
    by_iterations: list[dict[str, float]] = field(default_factory=list)
    two_label: bool = False


def read_entropy_curve(run_dir: Path) -> list[dict[str, Any]]:
    """``epoch``, ``routing_entropy`` and ``val_acc`` of each epoch in ``metrics.jsonl``
    (empty, with a warning, when none was logged)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise CapsmedError(f"{path}: no such file (not a run directory of capsmed train?)")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise CapsmedError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    curve = [{"epoch": r["epoch"], "routing_entropy": r["routing_entropy"],
              "val_acc": r.get("val_acc")} for r in records if "routing_entropy" in r]
    if not curve:
        log.warning("%s: no routing_entropy logged (the trainer logs it on the validation "
                    "split; this run has none, or an older capsmed trained it): only the "
                    "checkpoint's entropy is analysed", path)
    return curve


def sample_entropy(couplings: torch.Tensor) -> torch.Tensor:
    """Per-sample mean over lower capsules of the coupling entropy (nats): couplings
    [B, ..., J] (rows sum to 1 over the last axis) -> [B]."""
    c = couplings.float().flatten(1, -2)
    return -(c * torch.log(c.clamp_min(1e-12))).sum(-1).mean(-1)


def routing_layer_name(model: nn.Module) -> str:
    return "classes" if hasattr(model, "classes") else "routing"


def require_couplings(model: nn.Module, run_dir: Path, arch: str) -> None:
    if not model.returns_couplings:
        raise CapsmedError(f"{run_dir}: '{arch}' has no routing couplings; the routing "
                           "analysis needs a capsule network with routing (capsnet, "
                           "em-capsnet, parallel-dr, parallel-em)")


@torch.no_grad()
def checkpoint_entropy(model: nn.Module, images: np.ndarray, device: torch.device,
                 batch_size: int = 256) -> tuple[np.ndarray, int, int]:
    """Per-sample mean coupling entropy [N] of uint8 ``images``, and ``I``, ``J``."""
    values, shape = [], (0, 0)
    for _, _, out in common.forward_batches(model, images, device, batch_size,
                                            return_couplings=True):
        if out.couplings is None:
            raise CapsmedError(f"{type(model).__name__} returned no couplings")
        c = out.couplings
        shape = (int(np.prod(c.shape[1:-1])), int(c.shape[-1]))
        values.append(sample_entropy(c).cpu())
    return torch.cat(values).numpy().astype(np.float64), *shape


SWEEP = (1, 2, 3, 5)  # routing iterations the kept checkpoint is rerun with


def routed_layers(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """Every routing iteration count of the model, as (module, attribute), so that a
    rerun changes them all: each capsule layer's ``iterations`` (dynamic routing, and
    the EM routing of em-capsnet and parallel-em) and a model's own ``routing_iters``
    (parallel-dr's per-branch routing with 4 capsule layers). Changing only the class
    layer's count left the inner routing at the trained count, and em-capsnet's layers
    were not found at all (no rows, and no word)."""
    return [(m, name) for m in model.modules() for name in ("iterations", "routing_iters")
            if type(getattr(m, name, None)) is int]


def _predicted(model: nn.Module, images: np.ndarray, device: torch.device, batch_size: int,
               second: np.ndarray | None) -> np.ndarray:
    """Predicted classes [N]; for two-digit images the top two classes, sorted [N, 2]."""
    if second is None:
        return common.predict(model, images, device, batch_size)
    scores = common.class_scores(model, images, device, batch_size)
    return np.sort(np.argsort(-scores, axis=1, kind="stable")[:, :2], axis=1)


@torch.no_grad()
def iteration_sweep(model: nn.Module, images: np.ndarray, labels: np.ndarray,
                    device: torch.device, batch_size: int = 256,
                    counts: tuple[int, ...] = SWEEP, second: np.ndarray | None = None
                    ) -> list[dict[str, float]]:
    """Accuracy and coupling entropy of the kept checkpoint with each routing iteration
    count in ``counts`` (1: uniform couplings, no agreement step), the weights as
    trained. Tells whether the agreement steps change what the model predicts; empty
    for a model without a routing layer whose count can be set. With ``second`` labels
    (two digits per image) the accuracy is the two-digit accuracy and the agreement
    compares the top two classes."""
    layers = routed_layers(model)
    if not layers:
        return []
    saved = [getattr(m, name) for m, name in layers]
    trained = [max(1, count) for count in saved]  # 0 iterations run as 1
    rows, reference = [], None
    try:
        for count in sorted(set(counts) | set(trained)):
            for m, name in layers:
                setattr(m, name, count)
            entropy, _, upper = checkpoint_entropy(model, images, device, batch_size)
            predicted = _predicted(model, images, device, batch_size, second)
            right = (predicted == labels if second is None else
                     (predicted == np.sort(np.stack([labels, second], 1), axis=1)).all(1))
            rows.append({"iterations": count, "trained": count == trained[0],
                         "accuracy": float(right.mean()) if len(right) else 0.0,
                         "entropy": float(entropy.mean()),
                         "normalised": float(entropy.mean() / math.log(upper))
                         if upper > 1 else 0.0, "predicted": predicted})
    finally:
        for (m, name), count in zip(layers, saved, strict=True):
            setattr(m, name, count)
    reference = next(r["predicted"] for r in rows if r["trained"])
    for r in rows:
        same = (r.pop("predicted") == reference).reshape(len(reference), -1).all(1)
        r["agreement"] = float(same.mean())
    return rows


def routing_entropy(run_dir: Path, device: str = "auto", split: str = "test",
                    batch_size: int = 256) -> RoutingResult:
    """The routing entropy of one run over training and at its kept checkpoint."""
    run = common.open_analysed(run_dir, device=device)
    require_couplings(run.model, run.run_dir, run.arch)
    curve = read_entropy_curve(run.run_dir)
    samples = common.load_samples(run, split, with_meta=True)
    second = samples.meta.get(SECOND_LABEL)  # two digits per image: two-digit accuracy
    if second is not None:
        second = checked_second_labels(samples.labels, second, len(run.class_names),
                                              run.data_path, split)
    per_sample, lower, upper = checkpoint_entropy(run.model, samples.images, run.device,
                                                  batch_size)
    log_j = math.log(upper) if upper > 1 else 1.0  # J = 1: entropy 0, nothing to normalise
    per_class = {}
    for k, name in enumerate(run.class_names):
        # two digits per image: an image counts for both its classes (by the first
        # alone, a class drawn only as second digits was left out of the table)
        holds = samples.labels == k if second is None else (samples.labels == k) | (second == k)
        chosen = per_sample[holds]
        if len(chosen):
            per_class[name] = {"entropy": float(chosen.mean()),
                               "normalised": float(chosen.mean() / log_j),
                               "samples": int(len(chosen))}
    for point in curve:
        point["normalised"] = point["routing_entropy"] / log_j
    sweep = iteration_sweep(run.model, samples.images, samples.labels, run.device,
                            batch_size, second=second)
    return RoutingResult(run_dir=str(run.run_dir), arch=run.arch,
                         layer=routing_layer_name(run.model), lower_capsules=lower,
                         upper_capsules=upper, curve=curve,
                         test_entropy=float(per_sample.mean()),
                         test_normalised=float(per_sample.mean() / log_j),
                         per_class=per_class, samples=len(per_sample),
                         by_iterations=sweep, two_label=second is not None)


def _labels(results: list[RoutingResult]) -> list[str]:
    """Each run's legend entry: its folder name, or its whole path when two share one."""
    names = [Path(r.run_dir).name for r in results]
    names = names if len(set(names)) == len(names) else [r.run_dir for r in results]
    return [plain(n) for n in names]


def _plot_epochs(results: list[RoutingResult], labels: list[str], out: Path) -> None:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (ax_h, ax_n) = plt.subplots(1, 2, figsize=(10, 3.8))
    for r, label in zip(results, labels, strict=True):
        epochs = [p["epoch"] for p in r.curve]
        ax_h.plot(epochs, [p["routing_entropy"] for p in r.curve], marker="o", label=label)
        ax_n.plot(epochs, [p["normalised"] for p in r.curve], marker="o", label=label)
    ax_h.set_ylabel("mean coupling entropy (nats)")
    ax_n.set_ylabel("normalised entropy (H / log J)")
    for ax in (ax_h, ax_n):
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)  # entropies differ in late digits
    ax_h.legend(fontsize=8)
    fig.suptitle("Routing entropy over training (paper 003 Fig. 3a), validation split",
                 fontsize=9)
    save_figure(fig, out / "routing_entropy_epochs.png")


def _plot_against_accuracy(results: list[RoutingResult], labels: list[str], out: Path
                           ) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    by_epoch: dict[int, list[tuple[float, float]]] = {}
    for r, label, color in zip(results, labels, plt.cm.tab10.colors * 10, strict=False):
        points = [p for p in r.curve if p.get("val_acc") is not None]
        if not points:
            continue
        x = [p["routing_entropy"] for p in points]
        y = [p["val_acc"] for p in points]
        ax.plot(x, y, color=color, alpha=0.4)
        alphas = np.linspace(0.25, 1.0, len(points))  # transparency = training progress
        ax.scatter(x, y, color=[(*color[:3], a) for a in alphas], label=label, zorder=3)
        for p in points:
            by_epoch.setdefault(p["epoch"], []).append((p["routing_entropy"], p["val_acc"]))
    for same in by_epoch.values():  # grey lines link runs at the same epoch
        if len(same) > 1:
            same.sort()
            ax.plot(*zip(*same, strict=True), color="grey", linewidth=0.6, alpha=0.5)
    ax.set_xlabel("mean coupling entropy (nats)")
    ax.ticklabel_format(axis="x", useOffset=False)
    ax.set_ylabel("validation accuracy")
    ax.grid(alpha=0.3)
    if by_epoch:
        ax.legend(fontsize=8)
    ax.set_title("Entropy vs accuracy (paper 003 Fig. 3b); darker = later epoch", fontsize=9)
    save_figure(fig, out / "routing_entropy_vs_accuracy.png")


def _plot_test(results: list[RoutingResult], labels: list[str], out: Path) -> None:
    plt = pyplot()
    names = list(dict.fromkeys(c for r in results for c in r.per_class))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(names) + 3), 3.8))
    width = 0.8 / len(results)
    for i, (r, label) in enumerate(zip(results, labels, strict=True)):
        ax.bar(np.arange(len(names)) + i * width,
               [r.per_class.get(c, {}).get("normalised", np.nan) for c in names], width,
               label=label)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, [plain(n) for n in names],
                  rotation=45, ha="right")
    ax.set_ylabel("normalised entropy (H / log J)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("Kept checkpoint, test split, by true class", fontsize=9)
    save_figure(fig, out / "routing_entropy_test.png")


def analyze_routing(run_dirs: list[Path], out: Path | None = None, device: str = "auto",
                    split: str = "test", batch_size: int = 256
                    ) -> tuple[list[RoutingResult], Path]:
    """Routing entropy of one or more runs, curves overlaid; writes ``out`` (default:
    the first run's ``analysis/routing/``). Returns the results and the folder."""
    if not run_dirs:
        raise CapsmedError("give at least one run directory")
    results = [routing_entropy(Path(r), device, split, batch_size) for r in run_dirs]
    out = Path(out) if out is not None else common.analysis_dir(run_dirs[0], "routing")
    common.write_json(out / "routing.json", {
        "definition": "mean over samples and lower capsules of -sum_j c_ij log c_ij (nats); "
                      "normalised = / log J; curve: validation split per epoch",
        "split": split, "runs": [r.__dict__ for r in results]})
    common.write_csv(out / "routing_epochs.csv",
                     ["run", "arch", "epoch", "routing_entropy", "normalised", "val_acc"],
                     [[r.run_dir, r.arch, p["epoch"], p["routing_entropy"], p["normalised"],
                       p["val_acc"]] for r in results for p in r.curve])
    common.write_csv(out / "routing_iterations.csv",
                     ["run", "arch", "iterations", "trained", "accuracy", "entropy",
                      "normalised", "agreement"],
                     [[r.run_dir, r.arch, i["iterations"], i["trained"], i["accuracy"],
                       i["entropy"], i["normalised"], i["agreement"]]
                      for r in results for i in r.by_iterations])
    common.write_csv(out / "routing_test.csv",
                     ["run", "arch", "layer", "class", "entropy", "normalised", "samples"],
                     [row for r in results for row in (
                         [[r.run_dir, r.arch, r.layer, "all", r.test_entropy,
                           r.test_normalised, r.samples]]
                         + [[r.run_dir, r.arch, r.layer, c, v["entropy"], v["normalised"],
                             v["samples"]] for c, v in r.per_class.items()])])
    labels = _labels(results)
    if any(r.curve for r in results):
        _plot_epochs(results, labels, out)
        _plot_against_accuracy(results, labels, out)
    else:  # figures of an earlier call into this folder would pass for these runs'
        for name in ("routing_entropy_epochs.png", "routing_entropy_vs_accuracy.png"):
            (out / name).unlink(missing_ok=True)
    _plot_test(results, labels, out)
    return results, out
