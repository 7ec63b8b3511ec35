"""Paper 000 Fig. 2: a metric against the share of training data, per architecture.

Groups that differ only in ``fraction`` form one family; each family with at least two
fractions for some dataset gets one PNG with a panel per dataset, a line per
architecture (mean over repetitions) and a band of +- one sample std.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capsmed.evaluate.aggregate import Group, Stat
from capsmed.figures import plain, pyplot, save_figure
from capsmed.train.protocol import protocol_label

plt = pyplot()
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402  (after the backend)

# Paper 000 draws CapsNet solid, the Baseline dotted and LeNet dashed; others cycle.
PAPER_STYLES = {"capsnet": "-", "baseline": ":", "lenet": "--"}
LINE_STYLES = ("-.", "-", ":", "--")


@dataclass(frozen=True)
class FractionFamily:
    """Groups sharing every protocol setting but the fraction.

    Attributes:
        base: Label of the shared settings (``full`` when there are none).
        curves: ``{dataset: {arch: [(fraction, stat), ...]}}`` sorted by fraction.
    """

    base: str
    curves: dict[str, dict[str, list[tuple[float, Stat]]]]


def fraction_families(groups: Sequence[Group], metric: str) -> list[FractionFamily]:
    """Families with at least two training fractions for some dataset and architecture."""
    families: dict[str, dict[str, dict[str, list[tuple[float, Stat]]]]] = {}
    bases: dict[str, str] = {}
    for g in groups:
        stat = g.stat(metric)
        if stat is None:
            continue
        rest = {k: v for k, v in g.settings.items() if k != "fraction"}
        key = json.dumps(rest, sort_keys=True, default=str)
        bases[key] = protocol_label(rest)
        fraction = 1.0 if g.settings.get("fraction") is None else float(g.settings["fraction"])
        (families.setdefault(key, {}).setdefault(g.dataset, {}).setdefault(g.arch, [])
         .append((fraction, stat)))
    out = []
    for key, curves in families.items():
        if any(len(points) > 1 for arch in curves.values() for points in arch.values()):
            for arch in curves.values():
                for points in arch.values():
                    points.sort(key=lambda p: p[0])
            out.append(FractionFamily(bases[key], curves))
    return sorted(out, key=lambda f: (f.base != "full", f.base))


def family_filename(family: FractionFamily, metric: str) -> str:
    """``fraction_<metric>.png``, with the other settings slugged in when there are any."""
    if family.base == "full":
        return f"fraction_{metric}.png"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", family.base).strip("-").lower()
    return f"fraction_{metric}_{slug}.png"


def plot_fraction_family(family: FractionFamily, metric: str, metric_label: str,
                         path: Path) -> None:
    """One panel per dataset: mean line and +- std band per architecture (log x)."""
    datasets = list(family.curves)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.6),
                             squeeze=False, layout="constrained")
    archs = list(dict.fromkeys(a for d in datasets for a in family.curves[d]))
    for ax, dataset in zip(axes[0], datasets, strict=True):
        ticks = set()
        for k, arch in enumerate(archs):
            points = family.curves[dataset].get(arch)
            if not points:
                continue
            x = [100 * f for f, _ in points]
            mean = [s.mean for _, s in points]
            std = [s.std or 0.0 for _, s in points]
            ticks.update(x)
            style = PAPER_STYLES.get(arch, LINE_STYLES[k % len(LINE_STYLES)])
            color = f"C{k}"  # by architecture, so every panel uses the same colours
            ax.plot(x, mean, style, color=color, marker="o", markersize=3, label=plain(arch))
            ax.fill_between(x, [m - s for m, s in zip(mean, std, strict=True)],
                            [m + s for m, s in zip(mean, std, strict=True)],
                            color=color, alpha=0.2, linewidth=0)
        ax.set_xscale("log")  # paper 000's fractions span 1% to 100%
        ax.xaxis.set_major_locator(FixedLocator(sorted(ticks)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{t:g}%" for t in sorted(ticks)])
        ax.set_title(plain(dataset))
        ax.set_xlabel("training data")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(plain(f"{metric_label} (mean ± std)"))
    # every architecture of the family, not only those drawn in the last panel
    handles = {label: line for ax in axes[0] for line, label in
               zip(*ax.get_legend_handles_labels(), strict=True)}
    axes[0][-1].legend(list(handles.values()), list(handles), loc="best")
    if family.base != "full":
        fig.suptitle(plain(family.base))
    save_figure(fig, path, tight=False)
