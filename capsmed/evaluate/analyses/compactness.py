"""Semantic compactness score (paper 004 section 3.3, Table 5).

"What percentage of neurons strongly react to changes of a given latent factor": for a
factor z (rotation, translation, scale, shear) and an image X, paper 004

1. creates a list of images with different values of z;
2. obtains their representation vectors by forward inference, keeping the vectors of
   the ground-truth class;
3. computes the variance of the vectors in each dimension, ``Var``, and normalises it
   by its sum, ``Var_n = Var / sum(Var)``;
4. computes the KL divergence between ``Var_n`` and a uniform prior,
   ``KL(Var_n || U) = sum_d Var_n[d] log(D Var_n[d]) = log D - H(Var_n)``;

and averages over the dataset. If only one unit changes the score is ``log D`` (the
maximum); if all change equally it is 0. Our reading where the paper is silent:

* the list of values: ``steps`` (default 11) evenly spaced values over affNIST's
  ranges (see :mod:`capsmed.evaluate.analyses.affine`), identity included when
  ``steps`` is odd (an even count steps over it): rotation
  +-20 degrees, translation along x or y +-8 px on 40x40 (+-20% of the side), isotropic
  scale 0.8-1.2, shear along x or y with angle +-45 degrees (factor tan). Pixels brought
  in from outside are black (``padding``), as in affNIST;
* the variance is the population variance over the list; natural logarithm;
* representation: capsule networks (and paper 004's ConvNet-CR/-R/-CR-SF, whose grouped
  activations play the capsules' part) give the class capsule of the true class
  [D = 16]; other ConvNets give their penultimate layer, the input of their last
  ``nn.Linear`` (the class layer), read with a forward hook;
* a sample whose representation does not change at all (total variance below 1e-12 of
  its energy) has no normalised variance; it is left out of the mean and counted as
  ``undefined``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from capsmed.data.contract import SECOND_LABEL
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses import common
from capsmed.evaluate.analyses.affine import AFFNIST_CANVAS, affine_linear, warp
from capsmed.evaluate.analyses.configs import (
    CompactnessConfig,
)
from capsmed.figures import plain, pyplot, save_figure

log = logging.getLogger(__name__)

RELATIVE_FLOOR = 1e-12


def compactness_score(representations: torch.Tensor) -> torch.Tensor:
    """KL(normalised per-dimension variance || uniform) of representations [..., S, D]
    taken over the S values of a factor; returns [...] (NaN where nothing varies)."""
    r = representations.double()
    var = r.var(dim=-2, unbiased=False)
    total = var.sum(-1)
    energy = (r * r).mean(-2).sum(-1)
    defined = total > RELATIVE_FLOOR * energy.clamp_min(torch.finfo(torch.float64).tiny)
    p = var / torch.where(defined, total, torch.ones_like(total))[..., None]
    kl = torch.xlogy(p, p * r.shape[-1]).sum(-1)  # 0 log 0 = 0
    return torch.where(defined, kl, torch.full_like(kl, float("nan")))


def factor_transforms(factor: str, cfg: CompactnessConfig, size: tuple[int, int]
                      ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """The factor's values [S] and their linear parts [S, 2, 2] and shifts [S, 2] (px)."""
    s = cfg.steps
    ones, zeros = np.ones(s), np.zeros(s)
    shift = np.zeros((s, 2))
    if factor == "rotation":
        values = np.linspace(-cfg.rotation, cfg.rotation, s)
        linear = affine_linear(values, zeros, ones, ones)
    elif factor == "scale":
        values = np.linspace(*cfg.scale, s)
        linear = affine_linear(zeros, zeros, values, values)
    elif factor.startswith("translation"):
        axis = 0 if factor.endswith("x") else 1
        values = np.linspace(-cfg.translation, cfg.translation, s)
        shift[:, axis] = values * size[1 - axis] / AFFNIST_CANVAS  # x scales with W
        linear = affine_linear(zeros, zeros, ones, ones)
    else:  # shear-x: x' = x + tan(a) y; shear-y: y' = y + tan(a) x
        values = np.linspace(-cfg.shear, cfg.shear, s)
        linear = np.repeat(np.eye(2)[None], s, axis=0)
        i, j = (0, 1) if factor == "shear-x" else (1, 0)
        linear[:, i, j] = np.tan(np.radians(values))
    return values, torch.as_tensor(linear), torch.as_tensor(shift)


Extractor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def representation_extractor(model: nn.Module, probe: torch.Tensor) -> tuple[str, Extractor]:
    """How to read the representation: the true class's capsule when the model returns
    capsules, else the input of its last linear layer. Returns a description and a
    function ``(x, labels) -> [B, D]``."""
    with torch.no_grad():
        out = model(probe)
    if out.capsules is not None:
        def capsule(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            caps = model(x).capsules
            return caps[torch.arange(len(x), device=x.device), labels].flatten(1)

        return "class capsule of the true class", capsule
    name, layer = common.last_linear(model)

    def penultimate(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with common.CaptureInput(layer) as seen:
            model(x)
        return seen.value

    return f"penultimate layer (input of '{name}')", penultimate


@torch.no_grad()
def semantic_compactness(model: nn.Module, images: np.ndarray, labels: np.ndarray,
                         device: torch.device, cfg: CompactnessConfig
                         ) -> tuple[str, dict[str, dict[str, Any]]]:
    """Per factor: mean and std of the score over samples, samples used, undefined."""
    model.eval()
    describe, extract = representation_extractor(model, common.as_float(images[:1], device))
    size = images.shape[-2:]
    results = {}
    for factor in cfg.factors:
        values, linear, shift = factor_transforms(factor, cfg, size)
        s = len(values)
        scores, dim = [], 0
        for start in range(0, len(images), cfg.batch_size):
            x = common.as_float(images[start:start + cfg.batch_size], device)
            b = len(x)
            y = torch.as_tensor(labels[start:start + b], device=device)
            views = warp(x.repeat(s, 1, 1, 1), linear.repeat_interleave(b, 0),
                         shift.repeat_interleave(b, 0), cfg.padding)  # [S*B]: value-major
            reps = extract(views, y.repeat(s)).view(s, b, -1).transpose(0, 1)
            dim = reps.shape[-1]
            scores.append(compactness_score(reps).cpu())
        score = torch.cat(scores).numpy()
        ok = ~np.isnan(score)
        results[factor] = {"score": float(score[ok].mean()) if ok.any() else float("nan"),
                           "std": float(score[ok].std()) if ok.any() else float("nan"),
                           "samples": int(ok.sum()), "undefined": int((~ok).sum()),
                           "dimensions": dim, "max_score": float(np.log(dim)) if dim else 0.0,
                           "values": [float(v) for v in values]}
        if (~ok).any():
            log.info("%s: %d sample(s) with an unchanged representation left out",
                     factor, int((~ok).sum()))
    return describe, results


def _plot(results: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    plt = pyplot()
    names = list(results)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.0 * len(names) + 2), 3.6))
    ax.bar(names, [results[f]["score"] for f in names],
           yerr=[results[f]["std"] for f in names], capsize=3, color="tab:blue", alpha=0.8)
    ax.set_ylabel("compactness: KL(Var_n || uniform)")
    ax.tick_params(axis="x", rotation=30)
    ax.grid(alpha=0.3, axis="y")
    top = next(iter(results.values()))["max_score"]
    ax.set_title(f"{plain(title)}\n(max log D = {top:.2f}; error bars: std over samples)",
                 fontsize=9)
    save_figure(fig, path)


def analyze_compactness(run_dir: Path, config: CompactnessConfig | None = None,
                        data: Path | None = None, device: str = "auto"
                        ) -> tuple[dict[str, Any], Path]:
    """Compactness scores of ``run_dir``'s checkpoint; writes
    ``RUN_DIR/analysis/compactness/``. Returns the record and the folder."""
    cfg = config or CompactnessConfig()
    run = common.open_analysed(run_dir, data, device)
    samples = common.load_samples(run, cfg.split, with_meta=True,
                                  max_samples=cfg.max_samples, seed=cfg.seed)
    if SECOND_LABEL in samples.meta:  # which of the two digits' capsules would be kept?
        raise CapsmedError(f"{run.data_path}: split '{cfg.split}' has two labels per image "
                           f"({SECOND_LABEL}); the compactness score keeps the capsule of "
                           "the one ground-truth class (paper 004: MNIST), so score "
                           "single-digit images (--data)")
    describe, results = semantic_compactness(run.model, samples.images, samples.labels,
                                             run.device, cfg)
    record = {"run_dir": str(run.run_dir), "arch": run.arch, "data": str(run.data_path),
              "checkpoint_epoch": run.meta.get("epoch"), "representation": describe,
              "samples": len(samples), "settings": {**asdict(cfg), "scale": list(cfg.scale)},
              "factors": results}
    out = common.analysis_dir(run.run_dir, "compactness")
    common.write_json(out / "compactness.json", record)
    common.write_csv(out / "compactness.csv",
                     ["factor", "score", "std", "samples", "undefined", "dimensions",
                      "max_score"],
                     [[f, r["score"], r["std"], r["samples"], r["undefined"], r["dimensions"],
                       r["max_score"]] for f, r in results.items()])
    _plot(results, f"{run.arch} on {run.info.dataset}/{cfg.split}: {describe}",
          out / "compactness.png")
    return record, out
