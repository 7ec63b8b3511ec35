"""Two-digit translation manifold, t-SNE and Chamfer distance (paper 003 section 3.2).

Paper 003 builds test sets whose images lie on a known 2-D manifold: two digits
overlaid (as in MultiMNIST), one fixed at the centre, the other shifted by every
(row, col) offset in [-4, +4] x [-4, +4] "units", 9 x 9 = 81 images per (fixed, moving)
pair. A trained classifier's intermediate representation of the 81 images is embedded
in 2-D by t-SNE, and the Chamfer distance between the embedding and the regular grid
of offsets says how well the representation keeps the manifold (CapsNet 0.313 +-
0.010 against 0.394 +- 0.025 for a CNN, mean and variance over test sets). Our reading
where the paper is silent:

* digits: single images of the run's test split, the fixed one of class a and the
  moving one of class b != a; for a MultiMNIST file the first digit of each sample
  (``meta/image_a``), moved back by its recorded shift. Both are centred by their
  centre of mass (a whole-pixel shift, black fill), so that offset (0, 0) lays one
  centre on the other as in paper 003's Fig. 4 (MNIST stores digits centred this way;
  paper 004's randomly placed 40x40 digits are not); ``centre=False`` keeps them as
  stored. Overlay ``min(a + b, 255)`` as MultiMNIST; the moving digit is shifted with
  black fill. One unit = ``step`` px (default 1; MultiMNIST shifts digits by up to 4 px);
* representation: capsule networks give their class capsules (the capsules after the
  first routing, paper 003's "Cap1", in a CapsNet with one routed layer), flattened;
  paper 004's ConvNet-R/-CR/-CR-SF, which group FC(160) into class vectors without
  routing, give those (the output says "no routing");
  ConvNets the output of their first fully connected layer (paper 003's "Linear1"),
  before its activation;
  ``layer`` names any module instead (its output, flattened);
* t-SNE (scikit-learn, exact gradients, PCA initialisation, seeded) with perplexity
  ``min(30, (n - 1) / 3)`` unless given;
* normalisation: t-SNE's scale, position, rotation and reflection are arbitrary, so
  both point sets are centred and scaled to unit root-mean-square radius, and the
  embedding is rotated/reflected onto the grid by orthogonal Procrustes (the rows are
  matched: sample i belongs at grid offset i);
* Chamfer distance: ``(mean_a min_b |a - b| + mean_b min_a |a - b|) / 2``, Euclidean.
  It compares the two point sets as sets, so a lattice with the points in the wrong
  places would still score 0: the correspondence-aware ``aligned_error``, the mean
  distance of each aligned point to its own grid position, is reported beside it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from capsmed.data.contract import SECOND_LABEL, SplitData
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses import common
from capsmed.evaluate.analyses.configs import ManifoldConfig
from capsmed.figures import plain, pyplot, save_figure
from capsmed.train.run_data import CV_SPLIT

log = logging.getLogger(__name__)


def shift_image(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Image [C, H, W] moved by (dy, dx) px, black fill (nothing wraps around)."""
    out = np.zeros_like(image)
    h, w = image.shape[-2:]
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    out[..., yd, xd] = image[..., ys, xs]
    return out


def centre_on_mass(image: np.ndarray) -> np.ndarray:
    """Image [C, H, W] shifted by whole pixels to put its centre of mass at the centre."""
    mass = image.astype(np.float64).sum(axis=0)
    total = mass.sum()
    if total == 0:
        return image
    h, w = mass.shape
    cy = (mass.sum(axis=1) * np.arange(h)).sum() / total
    cx = (mass.sum(axis=0) * np.arange(w)).sum() / total
    return shift_image(image, int(round((h - 1) / 2 - cy)), int(round((w - 1) / 2 - cx)))


def grid_offsets(radius: int) -> np.ndarray:
    """(row, col) offsets [(2r+1)^2, 2], row-major: (-r,-r), (-r,-r+1), ..."""
    r = np.arange(-radius, radius + 1)
    return np.stack(np.meshgrid(r, r, indexing="ij"), -1).reshape(-1, 2)


def translation_grid(fixed: np.ndarray, moving: np.ndarray, radius: int = 4, step: int = 1
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Paper 003's test set: ``moving`` shifted by every grid offset over ``fixed``.

    Returns uint8 images [(2r+1)^2, C, H, W] and their (row, col) offsets in units.
    """
    offsets = grid_offsets(radius)
    images = np.stack([np.minimum(fixed.astype(np.uint16)
                                  + shift_image(moving, dy * step, dx * step), 255)
                       for dy, dx in offsets]).astype(np.uint8)
    return images, offsets


def single_digits(samples: SplitData, origin: str = "the data") -> np.ndarray:
    """One centred object per sample: MultiMNIST's first digits moved back to the
    centre, or the images themselves.

    Raises:
        CapsmedError: two-digit images without their first digits stored (``preprocess
            multimnist --no-store-sources``): each image holds two digits, not one; or
            first digits of another shape or type than the images.
    """
    meta = samples.meta
    if "image_a" in meta and "shift_a" in meta:
        sources, shape = meta["image_a"], samples.images.shape
        if sources.dtype != np.uint8 or sources.shape != shape:  # else moved wrongly
            raise CapsmedError(f"{origin}: meta/image_a must be uint8 {list(shape)} like "
                               f"its images (each image's first digit), got "
                               f"{sources.dtype} {list(sources.shape)}")
        return np.stack([shift_image(im, -int(dy), -int(dx))
                         for im, (dy, dx) in zip(meta["image_a"], meta["shift_a"], strict=True)])
    if SECOND_LABEL in meta:
        raise CapsmedError(f"{origin}: its images hold two digits ({SECOND_LABEL}) but not "
                           "their sources (meta/image_a, meta/shift_a), and the manifold "
                           "test needs single digits; make the file without "
                           "--no-store-sources, or pass --data with single-digit images")
    return samples.images


def choose_pairs(labels: np.ndarray, pairs: int, seed: int) -> list[tuple[int, int]]:
    """``pairs`` (fixed, moving) sample indices of two different classes; the class
    pairs are distinct while there are enough of them."""
    rng = np.random.default_rng([seed, 3])
    present = np.unique(labels)
    if len(present) < 2:
        raise CapsmedError("the manifold analysis needs samples of at least two classes")
    class_pairs = [(a, b) for a in present for b in present if a != b]
    order = rng.permutation(len(class_pairs))
    chosen = []
    for i in range(pairs):
        a, b = class_pairs[order[i % len(order)]]
        chosen.append((int(rng.choice(np.flatnonzero(labels == a))),
                       int(rng.choice(np.flatnonzero(labels == b)))))
    return chosen


def normalise_points(points: np.ndarray) -> np.ndarray:
    """Centre and scale to unit root-mean-square distance from the centroid."""
    p = np.asarray(points, dtype=np.float64)
    p = p - p.mean(axis=0)
    rms = np.sqrt((p * p).sum(axis=1).mean())
    return p / rms if rms > 0 else p


def chamfer_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Symmetric Chamfer distance: mean of the two mean nearest-neighbour distances."""
    from scipy.spatial.distance import cdist

    d = cdist(np.asarray(a, np.float64), np.asarray(b, np.float64))
    return float((d.min(axis=1).mean() + d.min(axis=0).mean()) / 2)


def align_to_grid(embedding: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both normalised; the embedding rotated/reflected onto the grid (Procrustes)."""
    from scipy.linalg import orthogonal_procrustes

    e, g = normalise_points(embedding), normalise_points(grid)
    rotation, _ = orthogonal_procrustes(e, g)
    return e @ rotation, g


def manifold_distances(embedding: np.ndarray, grid: np.ndarray) -> dict[str, float]:
    """Chamfer distance and correspondence-aware error of an embedding to its grid."""
    e, g = align_to_grid(embedding, grid)
    return {"chamfer": chamfer_distance(e, g),
            "aligned_error": float(np.linalg.norm(e - g, axis=1).mean())}


def embed_tsne(features: np.ndarray, perplexity: float | None, seed: int) -> np.ndarray:
    from sklearn.manifold import TSNE

    n = len(features)
    p = perplexity if perplexity is not None else min(30.0, (n - 1) / 3)
    if p >= n:
        raise CapsmedError(f"t-SNE perplexity must be below the number of points ({n}), "
                           f"got {p}")
    # exact gradients: for the 81-point grids it is faster than Barnes-Hut and not
    # approximate
    return TSNE(n_components=2, perplexity=p, init="pca", random_state=seed,
                learning_rate="auto", method="exact").fit_transform(features.astype(np.float64))


def _module(model: nn.Module, name: str) -> nn.Module:
    modules = dict(model.named_modules())
    if name not in modules:
        shown = ", ".join(n for n in modules if n and n.count(".") < 2)
        raise CapsmedError(f"the model has no layer '{name}' (layers: {shown})")
    return modules[name]


@torch.no_grad()
def representations(model: nn.Module, images: np.ndarray, device: torch.device,
                    layer: str | None = None, batch_size: int = 256) -> tuple[str, np.ndarray]:
    """A description and the flattened representation [N, F] of uint8 ``images``."""
    model.eval()
    probe = model(common.as_float(images[:1], device))
    if layer is None and probe.capsules is not None:
        feats = [out.capsules.flatten(1).float().cpu() for _, _, out in
                 common.forward_batches(model, images, device, batch_size)]
        routed = sum(1 for m in model.modules() if getattr(m, "iterations", None))
        if getattr(model, "capsule_layers", 3) == 4:  # parallel-dr routes per branch too
            routed += 1
        where = ("no routing: the grouped class activations" if routed == 0 else
                 "after the first routing" if routed == 1 else
                 "after the last routing, not paper 003's Cap1 after the first")
        return f"class capsules ({where})", torch.cat(feats).numpy()
    if layer is None:
        layer = next((n for n, m in model.named_modules() if isinstance(m, nn.Linear)
                      and not n.startswith("decoder")), None)
        if layer is None:
            raise CapsmedError(f"{type(model).__name__} has no fully connected layer; name "
                               "one with --layer")
    module, seen = _module(model, layer), []

    def hook(_m: nn.Module, _args: tuple, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        # a copy: an in-place activation (ReLU(inplace=True)) would change it afterwards
        seen.append(out.detach().flatten(1).float().clone().cpu())

    handle = module.register_forward_hook(hook)
    try:
        for _ in common.forward_batches(model, images, device, batch_size):
            pass
    finally:
        handle.remove()
    return f"output of '{layer}'", torch.cat(seen).numpy()


def _colours(offsets: np.ndarray) -> np.ndarray:
    span = max(1, int(np.abs(offsets).max()))
    unit = (offsets + span) / (2 * span)
    return np.stack([unit[:, 1], unit[:, 0], np.full(len(offsets), 0.55)], 1)


def _plot_embeddings(panels: list[dict[str, Any]], title: str, path: Path) -> None:
    plt = pyplot()
    n = len(panels)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, panel in zip(axes.flat, panels, strict=False):
        e, g, offsets = panel["aligned"], panel["grid"], panel["offsets"]
        index = {tuple(o): i for i, o in enumerate(offsets.tolist())}
        for i, (dy, dx) in enumerate(offsets.tolist()):  # lattice lines between neighbours
            for j in (index.get((dy, dx + 1)), index.get((dy + 1, dx))):
                if j is not None:
                    ax.plot(*zip(e[i], e[j], strict=True), color="grey", linewidth=0.5)
        ax.scatter(g[:, 0], g[:, 1], marker="+", color="lightgrey", s=20)
        ax.scatter(e[:, 0], e[:, 1], c=_colours(offsets), s=22, zorder=3)
        ax.set_title(f"fixed {plain(panel['fixed_class'])}, "
                     f"moving {plain(panel['moving_class'])}: "
                     f"CD {panel['chamfer']:.3f}", fontsize=8)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{plain(title)}\nt-SNE aligned onto the offset grid (+); colour: "
                 "red = column, green = row offset", fontsize=9)
    save_figure(fig, path)


def _plot_inputs(images: np.ndarray, side: int, path: Path) -> None:
    plt = pyplot()
    c, h, w = images.shape[1:]
    pad = max(1, h // 14)  # white gutters between the tiles
    padded = np.pad(images / 255.0, ((0, 0), (0, 0), (0, pad), (0, pad)), constant_values=1)
    tiles = padded.reshape(side, side, c, h + pad, w + pad).transpose(0, 3, 1, 4, 2)
    mosaic = tiles.reshape(side * (h + pad), side * (w + pad), c)[:-pad, :-pad]
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(mosaic if c == 3 else mosaic[..., 0], cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("first pair: moving digit shifted by (row, col) offsets", fontsize=9)
    save_figure(fig, path)


def analyze_manifold(run_dir: Path, config: ManifoldConfig | None = None,
                     data: Path | None = None, device: str = "auto"
                     ) -> tuple[dict[str, Any], Path]:
    """Paper 003's manifold test of ``run_dir``; writes ``RUN_DIR/analysis/manifold/``.
    Returns the record and the folder."""
    cfg = config or ManifoldConfig()
    run = common.open_analysed(run_dir, data, device)
    side = min(run.input_shape[1:])
    if cfg.radius * cfg.step >= side:  # the moving digit would leave the canvas whole
        raise CapsmedError(f"--radius {cfg.radius} x --step {cfg.step} px shifts the moving "
                           f"digit by up to {cfg.radius * cfg.step} px, off the {side} px "
                           "image; give a smaller radius or step")
    samples = common.load_samples(run, cfg.split, with_meta=True)
    # the indices name rows of the file: a cross-validation run's test samples are its
    # held-out rows of split 'all', whose sample i is not row i
    held_out = common.held_out_rows(run, cfg.split)
    rows_of = cfg.split if held_out is None else CV_SPLIT
    row = (lambda i: i) if held_out is None else (lambda i: int(held_out[i]))
    digits = single_digits(samples, f"{run.data_path}: split '{cfg.split}'")
    rows, panels, first_grid = [], [], None
    for fixed, moving in choose_pairs(samples.labels, cfg.pairs, cfg.seed):
        a, b = digits[fixed], digits[moving]
        if cfg.centre:
            a, b = centre_on_mass(a), centre_on_mass(b)
        images, offsets = translation_grid(a, b, cfg.radius, cfg.step)
        first_grid = images if first_grid is None else first_grid
        describe, feats = representations(run.model, images, run.device, cfg.layer,
                                          cfg.batch_size)
        embedding = embed_tsne(feats, cfg.perplexity, cfg.seed)
        scores = manifold_distances(embedding, offsets)
        aligned, grid = align_to_grid(embedding, offsets)
        entry = {"fixed_index": row(fixed), "moving_index": row(moving),
                 "fixed_class": run.class_names[samples.labels[fixed]],
                 "moving_class": run.class_names[samples.labels[moving]], **scores}
        rows.append(entry)
        panels.append({**entry, "aligned": aligned, "grid": grid, "offsets": offsets})
    chamfer = np.array([r["chamfer"] for r in rows])
    record = {"run_dir": str(run.run_dir), "arch": run.arch, "data": str(run.data_path),
              "checkpoint_epoch": run.meta.get("epoch"), "representation": describe,
              "settings": asdict(cfg), "indices_of_split": rows_of,
              "grid_points": int((2 * cfg.radius + 1) ** 2),
              "chamfer_mean": float(chamfer.mean()), "chamfer_variance": float(chamfer.var()),
              "aligned_error_mean": float(np.mean([r["aligned_error"] for r in rows])),
              "pairs": rows}
    out = common.analysis_dir(run.run_dir, "manifold")
    common.write_json(out / "manifold.json", record)
    common.write_csv(out / "manifold.csv",
                     ["fixed_class", "moving_class", "fixed_index", "moving_index", "chamfer",
                      "aligned_error"],
                     [[r["fixed_class"], r["moving_class"], r["fixed_index"],
                       r["moving_index"], r["chamfer"], r["aligned_error"]] for r in rows])
    _plot_embeddings(panels, f"{run.arch}: {describe}", out / "manifold.png")
    _plot_inputs(first_grid, 2 * cfg.radius + 1, out / "manifold_inputs.png")
    return record, out
