"""Affine robustness (paper 004 section 3.1): accuracy under affNIST-like transforms.

Paper 004 trains on MNIST placed at random on a 40x40 canvas and tests on affNIST,
whose digits are warped by "rotation within 20 degrees, shearing within 45 degrees,
scaling from 0.8 to 1.2 in both vertical and horizontal directions, and translation
within 8 pixels in each direction". This module applies such transforms on the fly to a
run's test split, batched on the device, and also scores a real affNIST contract file
(``capsmed preprocess affnist``) when one is given. Our reading, the same as
``capsmed synth affnist``:

* the linear part is ``R(angle) @ [[1, tan(shear)], [0, 1]] @ diag(sx, sy)`` about the
  image centre; angle and shear angle uniform in +-20 and +-45 degrees, ``sx`` and
  ``sy`` drawn independently in [0.8, 1.2];
* the translation is uniform in +-8 px per axis on 40x40, i.e. +-20% of the side, so
  other image sizes get the same share of their side (8 * W / 40 px, 8 * H / 40 px);
* like affNIST ("never so much that the digit goes off the image"), the translation
  range is narrowed per image so that every content pixel stays on the canvas
  (``keep_inside``). Content = pixels that differ from the image's background, the
  median of its border pixels. The shift never leaves the +-8 px range: when no shift
  in it keeps the content whole, the one closest to centring it is used. When the
  content fills the canvas (most histology patches) no translation fits: the applied
  mean shift is recorded and a warning says so (turn it off with
  ``keep_inside=False``);
* pixels brought in from outside are black (``padding="zeros"``, as affNIST), or the
  edge / a reflection for textured medical images.

Also: a rotation sweep (accuracy at every ``sweep_step`` degrees over -180..180; positive
angles turn clockwise as displayed) and flip invariance (accuracy on left-right and
up-down flipped inputs, which are exact, and the share of predictions they leave
unchanged). Parameters are drawn on the host from a seeded NumPy generator, so results
do not depend on the device.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from capsmed.data.contract import load_split, read_info
from capsmed.errors import CapsmedError
from capsmed.evaluate.analyses import common
from capsmed.evaluate.analyses.configs import AffineConfig
from capsmed.figures import plain, pyplot, save_figure
from capsmed.runs import OpenRun

log = logging.getLogger(__name__)

AFFNIST_CANVAS = 40
INK_LEVEL = 0.5 / 255  # content = differs from the background by at least half a grey level


@dataclass
class AffineResult:
    """Accuracies of one model under the transforms (see :func:`affine_robustness`)."""

    samples: int
    clean_accuracy: float
    affine_accuracy: float
    affine_accuracy_per_repeat: list[float]
    translation_limit_px: list[float]
    mean_abs_translation_px: float
    sweep_angles: list[float]
    sweep_accuracy: list[float]
    flips: dict[str, dict[str, float]]
    affnist: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)


def affine_linear(angle: np.ndarray, shear: np.ndarray, sx: np.ndarray, sy: np.ndarray
                  ) -> np.ndarray:
    """Linear parts [N, 2, 2] ``R(angle) @ shear_x(tan shear) @ diag(sx, sy)`` (degrees;
    x right, y down, so a positive angle turns clockwise as displayed)."""
    a, t = np.radians(angle), np.tan(np.radians(shear))
    cos, sin = np.cos(a), np.sin(a)
    rot = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    sh = np.zeros_like(rot)
    sh[:, 0, 0], sh[:, 0, 1], sh[:, 1, 1] = 1.0, t, 1.0
    return rot @ sh @ (np.eye(2) * np.stack([sx, sy], -1)[:, None, :])


def warp(x: torch.Tensor, linear: torch.Tensor, shift: torch.Tensor, padding: str = "zeros"
         ) -> torch.Tensor:
    """Warp images [B, C, H, W] by ``p_out = linear @ p_in + shift`` (pixels, about the
    image centre, x right / y down) with one bilinear ``grid_sample``.

    ``grid_sample`` needs the inverse map in normalised coordinates (align_corners=False:
    a pixel offset ``p`` from the centre is ``p / (W/2)``, ``p / (H/2)``). The B 2x3
    matrices are computed on the host in float64 (MPS has no float64).
    """
    h, w = x.shape[-2:]
    d = torch.tensor([w / 2, h / 2], dtype=torch.float64)
    inv = torch.linalg.inv(linear.detach().to("cpu", torch.float64))
    t = shift.detach().to("cpu", torch.float64)
    theta = torch.cat([inv * d[None, None, :] / d[None, :, None],
                       (-(inv @ t[..., None])[..., 0] / d)[..., None]], dim=-1)
    grid = F.affine_grid(theta.to(x.device, x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding, align_corners=False)


def inside_shifts(x: torch.Tensor, linear: torch.Tensor, u: torch.Tensor,
                  limit: torch.Tensor) -> torch.Tensor:
    """Shifts [B, 2] (px) uniform in ``u`` in [-1, 1] over +-``limit``, narrowed so that
    every content pixel of ``x`` mapped by ``linear`` stays on the canvas.

    When no shift within +-``limit`` keeps the content inside (content larger than the
    canvas, or pushed far off-centre by the linear part), the shift is the one within
    +-``limit`` closest to centring it; blank images get the plain draw.
    """
    h, w = x.shape[-2:]
    f32 = {"device": x.device, "dtype": torch.float32}  # pixel coordinates: float32 is ample
    border = torch.cat([x[..., 0, :], x[..., -1, :], x[..., :, 0], x[..., :, -1]], dim=-1)
    background = border.median(dim=-1).values[..., None, None]
    ink = ((x - background).abs().amax(dim=1) > INK_LEVEL).flatten(1)  # [B, H*W]
    ys, xs = torch.meshgrid(torch.arange(h, **f32) - (h - 1) / 2,
                            torch.arange(w, **f32) - (w - 1) / 2, indexing="ij")
    moved = linear.to(**f32) @ torch.stack([xs.flatten(), ys.flatten()])  # [B, 2, H*W]
    inf = torch.tensor(float("inf"), **f32)
    low = torch.where(ink[:, None, :], moved, inf).amin(-1)  # [B, 2]
    high = torch.where(ink[:, None, :], moved, -inf).amax(-1)
    half = torch.tensor([(w - 1) / 2, (h - 1) / 2], **f32)
    limit = limit.to(**f32)
    need_lo, need_hi = -half - low, half - high  # the shifts that keep the content inside
    lo, hi = torch.maximum(-limit, need_lo), torch.minimum(limit, need_hi)
    u = u.to(**f32)
    closest = torch.minimum(torch.maximum((need_lo + need_hi) / 2, -limit), limit)
    fitted = torch.where(lo <= hi, lo + (u + 1) / 2 * (hi - lo), closest)
    return torch.where(ink.any(1)[:, None], fitted, u * limit)


def translation_limit(cfg: AffineConfig, size: tuple[int, int]) -> np.ndarray:
    """Maximum shift (x, y) in px: ``translation`` on 40 px, scaled to the image side."""
    h, w = size
    return np.array([cfg.translation * w / AFFNIST_CANVAS, cfg.translation * h / AFFNIST_CANVAS])


def draw_parameters(cfg: AffineConfig, n: int) -> dict[str, np.ndarray]:
    """Seeded transform parameters for ``repeats`` x ``n`` images."""
    rng = np.random.default_rng([cfg.seed, 4])
    shape = (cfg.repeats, n)
    angle = rng.uniform(-cfg.rotation, cfg.rotation, shape)
    shear = rng.uniform(-cfg.shear, cfg.shear, shape)
    sx, sy = rng.uniform(*cfg.scale, (2, *shape))
    u = rng.uniform(-1.0, 1.0, (*shape, 2))
    linear = affine_linear(angle.ravel(), shear.ravel(), sx.ravel(), sy.ravel())
    return {"linear": linear.reshape(*shape, 2, 2), "u": u}


def affine_robustness(model: nn.Module, images: np.ndarray, labels: np.ndarray,
                      device: torch.device, cfg: AffineConfig) -> AffineResult:
    """Accuracy of ``model`` on uint8 ``images`` [N, C, H, W]: clean, under random
    affNIST-like transforms, along a rotation sweep, and on flipped inputs."""
    n = len(images)
    size = images.shape[-2:]
    bs = cfg.batch_size
    clean = common.predict(model, images, device, bs)
    params = draw_parameters(cfg, n)
    limit = torch.as_tensor(translation_limit(cfg, size))
    per_repeat, shifts = [], []
    for r in range(cfg.repeats):
        linear = torch.as_tensor(params["linear"][r])
        u = torch.as_tensor(params["u"][r])

        def random_affine(x: torch.Tensor, start: int, linear=linear, u=u) -> torch.Tensor:
            m, v = linear[start:start + len(x)], u[start:start + len(x)]
            t = (inside_shifts(x, m, v, limit) if cfg.keep_inside
                 else v * limit)
            shifts.append(t.abs().mean(1).cpu())
            return warp(x, m, t, cfg.padding)

        per_repeat.append(common.accuracy(
            common.predict(model, images, device, bs, random_affine), labels))
    applied = float(torch.cat(shifts).mean()) if shifts else 0.0
    if cfg.keep_inside and cfg.translation > 0 and applied < 0.25 * float(limit.mean()) / 2:
        log.warning("the content fills most of the canvas: keeping it inside left a mean "
                    "shift of %.2f px of the +-%.1f px range (--free-translation, or "
                    "keep_inside: false, translates freely)", applied, float(limit.mean()))

    angles = np.arange(-180.0, 180.0 + 1e-9, cfg.sweep_step)
    if angles[-1] < 180.0:
        angles = np.append(angles, 180.0)
    sweep = []
    for angle in angles:
        rot = torch.as_tensor(affine_linear(np.array([angle]), np.zeros(1), np.ones(1),
                                            np.ones(1)))

        def rotate(x: torch.Tensor, start: int, rot=rot) -> torch.Tensor:
            b = len(x)
            return warp(x, rot.expand(b, 2, 2), torch.zeros(b, 2), cfg.padding)

        sweep.append(common.accuracy(common.predict(model, images, device, bs, rotate), labels))

    flips = {}
    for name, dim in (("hflip", -1), ("vflip", -2)):
        pred = common.predict(model, images, device, bs,
                              lambda x, _s, dim=dim: torch.flip(x, dims=(dim,)))
        flips[name] = {"accuracy": common.accuracy(pred, labels),
                       "unchanged": float((pred == clean).mean())}
    return AffineResult(
        samples=n, clean_accuracy=common.accuracy(clean, labels),
        affine_accuracy=float(np.mean(per_repeat)), affine_accuracy_per_repeat=per_repeat,
        translation_limit_px=[float(v) for v in limit], mean_abs_translation_px=applied,
        sweep_angles=[float(a) for a in angles], sweep_accuracy=sweep, flips=flips,
        settings={**asdict(cfg), "scale": list(cfg.scale)})


def check_affnist(run: OpenRun, path: Path) -> None:
    """Refuse an affNIST file whose classes or image size differ from the run's."""
    info = read_info(path)
    if list(info.class_names) != list(run.class_names):
        raise CapsmedError(f"{path}: classes {list(info.class_names)} do not match the run's "
                           f"{list(run.class_names)} (affNIST holds the digits 0-9)")
    if (info.channels, *info.image_size) != run.input_shape:
        c, h, w = run.input_shape
        raise CapsmedError(f"{path}: images are {info.channels}x{info.image_size[0]}x"
                           f"{info.image_size[1]}, the model expects {c}x{h}x{w} (train on "
                           "40x40 digits: capsmed preprocess mnist --placement random40)")


def affnist_accuracy(run: OpenRun, path: Path, batch_size: int) -> dict[str, Any]:
    """Accuracy on a real affNIST contract file's ``test`` split (classes and image size
    must match the run's)."""
    check_affnist(run, path)
    data = load_split(path, "test")
    if not len(data):
        raise CapsmedError(f"{path}: split 'test' has no samples")
    pred = common.predict(run.model, data.images, run.device, batch_size)
    return {"path": str(path), "samples": len(data), "accuracy": common.accuracy(pred,
                                                                                 data.labels)}


def _plot_sweep(result: AffineResult, title: str, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.plot(result.sweep_angles, result.sweep_accuracy, marker="o", label="rotated")
    ax.axhline(result.clean_accuracy, color="grey", linestyle="--", label="untransformed")
    ax.axhline(result.affine_accuracy, color="tab:orange", linestyle=":",
               label="random affine (affNIST ranges)")
    if result.affnist is not None:
        ax.axhline(result.affnist["accuracy"], color="tab:green", linestyle="-.",
                   label="affNIST file")
    ax.set_xlabel("rotation (degrees, clockwise)")
    ax.set_ylabel("accuracy")
    ax.set_xticks(range(-180, 181, 45))
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(plain(title), fontsize=9)
    save_figure(fig, path)


def _plot_examples(images: np.ndarray, cfg: AffineConfig, path: Path) -> None:
    """A few test images: untransformed, random affine, rotated 90, flipped."""
    x = common.as_float(images[:8], torch.device("cpu"))
    params = draw_parameters(cfg, len(images))
    m, u = torch.as_tensor(params["linear"][0][:8]), torch.as_tensor(params["u"][0][:8])
    limit = torch.as_tensor(translation_limit(cfg, images.shape[-2:]))
    t = inside_shifts(x, m, u, limit) if cfg.keep_inside else u * limit
    rot = torch.as_tensor(affine_linear(np.full(len(x), 90.0), np.zeros(len(x)),
                                        np.ones(len(x)), np.ones(len(x))))
    rows = {"input": x, "random affine": warp(x, m, t, cfg.padding),
            "rotated 90": warp(x, rot, torch.zeros(len(x), 2), cfg.padding),
            "hflip": torch.flip(x, dims=(-1,)), "vflip": torch.flip(x, dims=(-2,))}
    plt = pyplot()
    fig, axes = plt.subplots(len(rows), len(x), figsize=(1.1 * len(x), 1.2 * len(rows)),
                             squeeze=False)
    for i, (name, batch) in enumerate(rows.items()):
        for j in range(len(x)):
            image = batch[j].clamp(0, 1).numpy()
            axes[i, j].imshow(image.transpose(1, 2, 0) if image.shape[0] == 3 else image[0],
                              cmap="gray", vmin=0, vmax=1)
            axes[i, j].set_xticks([])
            axes[i, j].set_yticks([])
        axes[i, 0].set_ylabel(name, fontsize=7)
    save_figure(fig, path)


def analyze_affine(run_dir: Path, data: Path | None = None, affnist: Path | None = None,
                   config: AffineConfig | None = None, device: str = "auto"
                   ) -> tuple[AffineResult, Path]:
    """Run the affine analysis of ``run_dir``; write ``RUN_DIR/analysis/affine/``.

    Args:
        run_dir: A run directory written by ``capsmed train``.
        data: Take the test images from this file instead (same classes and size).
        affnist: Also score this affNIST contract file (``capsmed preprocess affnist``).
        config: Transform ranges, repeats, sweep step, seed.
        device: ``auto``, ``cpu``, ``cuda``, ``mps``.

    Returns:
        The result and the folder written.
    """
    cfg = config or AffineConfig()
    run = common.open_analysed(run_dir, data, device)
    if affnist is not None:  # fail before the long part
        check_affnist(run, Path(affnist))
    samples = common.load_samples(run, cfg.split, with_meta=True,
                                  max_samples=cfg.max_samples, seed=cfg.seed)
    common.refuse_two_label(samples, run.data_path, cfg.split, "affine")
    result = affine_robustness(run.model, samples.images, samples.labels, run.device, cfg)
    if affnist is not None:
        result.affnist = affnist_accuracy(run, Path(affnist), cfg.batch_size)
    out = common.analysis_dir(run.run_dir, "affine")
    title = f"{run.arch} on {run.info.dataset}/{cfg.split} ({result.samples} images)"
    record = {"run_dir": str(run.run_dir), "arch": run.arch, "data": str(run.data_path),
              "checkpoint_epoch": run.meta.get("epoch"), **asdict(result)}
    rows = [["untransformed", result.clean_accuracy, result.samples],
            ["random affine", result.affine_accuracy, result.samples * cfg.repeats],
            *[[name, v["accuracy"], result.samples] for name, v in result.flips.items()]]
    if result.affnist is not None:
        rows.append(["affNIST file", result.affnist["accuracy"], result.affnist["samples"]])
    common.write_json(out / "affine.json", record)
    common.write_csv(out / "affine.csv", ["condition", "accuracy", "samples"], rows)
    common.write_csv(out / "rotation_sweep.csv", ["angle", "accuracy"],
                     list(zip(result.sweep_angles, result.sweep_accuracy, strict=True)))
    _plot_sweep(result, title, out / "rotation_sweep.png")
    _plot_examples(samples.images, cfg, out / "examples.png")
    return result, out
