"""A labelled grid of random samples per class from any dataset file (``capsmed data preview``).

Rows are classes (name and count in the split), columns random samples of that class;
each cell is captioned with the sample's group and, for a split with CV folds, its
fold. Only the chosen images are read from the file, so large datasets preview quickly.
"""

from __future__ import annotations

import logging
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsmed.data.contract import read_info
from capsmed.data.schema import reading
from capsmed.errors import CapsmedError
from capsmed.figures import plain
from capsmed.io import atomic_path

log = logging.getLogger(__name__)

DPI = 100


@dataclass(frozen=True)
class GridLayout:
    """Pixel geometry of a preview grid (fixed, so output sizes are predictable).

    The figure is ``label + per_class * cell_width + margin`` pixels wide and
    ``title + rows * cell_height + margin`` high; each cell holds a caption line above
    a square image box of ``cell_width - 2 * pad`` pixels.
    """

    rows: int
    per_class: int
    label: int = 150
    title: int = 50
    cell_width: int = 110
    cell_height: int = 124
    caption: int = 14
    pad: int = 5
    margin: int = 10

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return (self.label + self.per_class * self.cell_width + self.margin,
                self.title + self.rows * self.cell_height + self.margin)

    def image_box(self, row: int, col: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) pixels of cell (row, col)'s image box."""
        left = self.label + col * self.cell_width + self.pad
        top = self.title + row * self.cell_height + self.caption
        side = self.cell_width - 2 * self.pad
        return left, top, left + side, top + side


def _choose(labels: np.ndarray, num_classes: int, per_class: int,
            rng: np.random.Generator) -> list[np.ndarray]:
    """Sorted random indices (up to ``per_class``) of each class."""
    chosen = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        pick = rng.choice(members, size=min(per_class, len(members)), replace=False)
        chosen.append(np.sort(pick))
    return chosen


def _row_label(name: str, width: int = 18, lines: int = 5) -> str:
    """A class name in lines that fit the label column, whole up to ``lines`` lines, then
    cut with '~' (cut to one line, 'tumour_grade_1' and 'tumour_grade_2' of a long
    common start labelled two rows alike)."""
    wrapped = textwrap.wrap(name, width, break_on_hyphens=False) or [name[:width]]
    if len(wrapped) > lines:
        wrapped = [*wrapped[:lines - 1], wrapped[lines - 1][:width - 1] + "~"]
    return "\n".join(wrapped)


def _as_display(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    """(C, H, W) uint8 -> what imshow takes: RGB (H, W, 3), or the first channel in grey."""
    if image.shape[0] == 3:
        return image.transpose(1, 2, 0), None
    return image[0], "gray"


def preview_dataset(path: Path, output: Path, *, split: str | None = None,
                    per_class: int = 8, seed: int = 0) -> Path:
    """Write a PNG grid of ``per_class`` random samples of every class in ``split``.

    Args:
        path: A dataset file written by capsmed (any source).
        output: Image to write (atomically); the suffix picks the format (png, pdf, svg,
            jpg); pixel size is :attr:`GridLayout.size` at 100 dpi.
        split: Split to show; None = ``train`` if present, else the file's first split.
        per_class: Samples per class (fewer when a class has fewer).
        seed: Seed for the random choice of samples.

    Returns:
        ``output``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path, output = Path(path), Path(output)
    if not 1 <= per_class <= 64:
        raise CapsmedError(f"--per-class must be within 1..64, got {per_class}")
    if seed < 0:
        raise CapsmedError(f"--seed must be >= 0, got {seed}")
    info = read_info(path)
    if split is None:
        split = "train" if "train" in info.split_sizes else next(iter(info.split_sizes))
    if split not in info.split_sizes:
        raise CapsmedError(f"{path}: has no '{split}' split (has: "
                           f"{', '.join(info.split_sizes)})")
    fmt = (output.suffix[1:] or "png").lower()
    fig = Figure(dpi=DPI)
    canvas = FigureCanvasAgg(fig)
    if fmt not in canvas.get_supported_filetypes():
        raise CapsmedError(f"{output}: unsupported image format '{fmt}' (use .png, .pdf, "
                           ".svg or .jpg)")

    with reading(path) as f:  # a damaged body: one line naming the file
        grp = f[split]
        labels = grp["labels"][...]
        chosen = _choose(labels, info.num_classes, per_class, np.random.default_rng(seed))
        wanted = np.unique(np.concatenate(chosen)) if chosen else np.empty(0, np.int64)
        # h5py reads a sorted index list; rows[i] is the position of sample i in `images`
        images = grp["images"][wanted] if len(wanted) else np.empty((0,))
        rows = {int(i): k for k, i in enumerate(wanted)}
        group_ids = grp["groups"].asstr()[...]
        folds = grp["folds"][...] if "folds" in grp else None

    layout = GridLayout(rows=info.num_classes, per_class=per_class)
    width, height = layout.size
    fig.set_size_inches(width / DPI, height / DPI)
    fig.patch.set_facecolor("white")
    counts = np.bincount(labels, minlength=info.num_classes)
    note = "" if info.channels in (1, 3) else f"; channel 0 of {info.channels} shown"
    fig.text(0.5, 1 - 22 / height, plain(f"{info.dataset} - split '{split}' ({len(labels):,} "
                                         f"samples; {per_class} random per class, seed "
                                         f"{seed}{note})"),
             ha="center", va="center", fontsize=11, weight="bold")
    for r, (name, picks) in enumerate(zip(info.class_names, chosen, strict=True)):
        middle = layout.title + r * layout.cell_height + layout.cell_height / 2
        fig.text(10 / width, 1 - middle / height, plain(f"{_row_label(name)}\nn={counts[r]:,}"),
                 ha="left", va="center", fontsize=9)
        if not len(picks):
            fig.text((layout.label + 10) / width, 1 - middle / height, "no samples",
                     ha="left", va="center", fontsize=8, color="grey")
        for col, index in enumerate(picks):
            left, top, right, bottom = layout.image_box(r, col)
            ax = fig.add_axes((left / width, 1 - bottom / height, (right - left) / width,
                               (bottom - top) / height))
            shown, cmap = _as_display(images[rows[int(index)]])
            ax.imshow(shown, cmap=cmap, vmin=0, vmax=255, interpolation="nearest")
            ax.set_axis_off()
            caption = group_ids[index] if len(group_ids[index]) <= 16 \
                else group_ids[index][:15] + "~"
            if folds is not None:
                caption += f"  fold {int(folds[index])}"
            fig.text((left + right) / 2 / width, 1 - (top - 3) / height, plain(caption),
                     ha="center", va="bottom", fontsize=6, color="dimgrey")
    with atomic_path(output) as tmp:
        fig.savefig(tmp, format=fmt, dpi=DPI, facecolor="white")
    log.info("wrote %s (%dx%d px; split '%s')", output, width, height, split)
    return output
