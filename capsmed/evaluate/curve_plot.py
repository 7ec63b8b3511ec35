"""A study table drawn as curves, the paper's numbers beside ours (paper 000 Fig. 2).

A table whose rows are ordered conditions (training fractions, say) becomes one line
per column (architecture): our mean over the repetitions with a band of +- one sample
std, and the paper's printed numbers as hollow markers joined by a thin dotted line of
the same colour, so a reader sees at once where the reproduction departs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from capsmed.errors import CapsmedError
from capsmed.figures import plain, pyplot, save_figure

# Paper 000 draws CapsNet solid, the Baseline dotted and LeNet dashed (Fig. 2).
PAPER_STYLES = {"capsnet": "-", "baseline": ":", "lenet": "--"}


def plot_curves(path: Path, title: str, x: Mapping[str, float],
                ours: Mapping[str, Mapping[str, Sequence[float]]],
                paper: Mapping[str, Mapping[str, float]] | None = None, *,
                xlabel: str = "training data (%)", ylabel: str = "macro F1",
                log_x: bool = True, scale: float = 1.0) -> dict[str, int]:
    """Draw ``ours[column][row]`` (values over the repetitions) against ``x[row]``, and
    ``paper[row][column]`` as markers; write the PNG to ``path``.

    Returns:
        How many points were drawn: ``{"ours": n, "paper": m}``.

    Raises:
        CapsmedError: ``log_x`` with a row at x <= 0, which a log axis cannot place
            (matplotlib draws a broken axis, the other rows squeezed into one corner).
    """
    unplaceable = [f"{row} (x = {value:g})" for row, value in x.items() if value <= 0]
    if log_x and unplaceable:
        raise CapsmedError(f"{path}: '{title}' puts {', '.join(unplaceable)} at x <= 0, "
                           "which a log axis cannot show; give the curve log_x: false")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = {"ours": 0, "paper": 0}
    for k, (column, per_row) in enumerate(ours.items()):
        colour = colours[k % len(colours)]
        rows = sorted((r for r in per_row if r in x and per_row[r]), key=lambda r: x[r])
        if rows:
            xs = np.array([x[r] for r in rows], dtype=float)
            values = [np.asarray(per_row[r], dtype=float) * scale for r in rows]
            mean = np.array([v.mean() for v in values])
            std = np.array([v.std(ddof=1) if v.size > 1 else 0.0 for v in values])
            ax.plot(xs, mean, PAPER_STYLES.get(column, "-"), color=colour, marker="o",
                    markersize=4, label=plain(f"{column} (ours)"))
            ax.fill_between(xs, mean - std, mean + std, color=colour, alpha=0.15,
                            linewidth=0)
            drawn["ours"] += len(rows)
        theirs = sorted((r for r in (paper or {}) if r in x
                         and isinstance((paper or {})[r].get(column), int | float)),
                        key=lambda r: x[r])
        if theirs:
            ax.plot([x[r] for r in theirs], [paper[r][column] for r in theirs], ":",
                    color=colour, linewidth=0.8, marker="s", markerfacecolor="none",
                    markersize=6, label=plain(f"{column} (paper)"))
            drawn["paper"] += len(theirs)
    if log_x:
        ax.set_xscale("log")
        ticks = sorted(set(x.values()))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set(xlabel=plain(xlabel), ylabel=plain(ylabel), title=plain(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=2)
    save_figure(fig, path)
    return drawn
