"""What routing does in a study's capsule runs: a section of the study page.

For each run of the study that an analysis of this pipeline gave
``analysis/routing/routing.json`` (``capsmed analyze routing``), two tables: the mean
coupling entropy of the routing layer on the test split with 1, 2, 3 and 5 routing
iterations (beside the uniform couplings' log J, the most there is), and the accuracy
with 1 iteration (uniform couplings, no agreement step) against 3 (Sabour et al.'s), with
the share of test images given the same class. Entropy near log J at every count and the
same predictions with 1 and 3 iterations say that routing-by-agreement changed nothing
the model predicts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsmed.tables import Column, Table, text_column

ROUTING_FILE = Path("analysis") / "routing" / "routing.json"


def _entries(run_dir: Path) -> list[dict[str, Any]]:
    """The run's own entry (entries) of its routing.json; [] without one."""
    try:
        data = json.loads((run_dir / ROUTING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    runs = [r for r in data.get("runs") or [] if isinstance(r, dict)]
    own = [r for r in runs if Path(str(r.get("run_dir"))).name == run_dir.name]
    return own or runs[:1]


def _at(entry: dict[str, Any], count: int) -> dict[str, Any] | None:
    return next((i for i in entry.get("by_iterations") or []
                 if i.get("iterations") == count), None)


def _value(row: dict[str, Any] | None, key: str, digits: int) -> str:
    value = None if row is None else row.get(key)
    return "-" if not isinstance(value, int | float) else f"{value:.{digits}f}"


def routing_tables(run_dirs: Sequence[tuple[str, Path]], analysed: set[str]
                   ) -> tuple[list[Table], list[dict[str, Any]]]:
    """The two routing tables over ``(run label, run folder)``; only folders an
    analysis of this pipeline wrote (``analysed``) are read. ``([], [])`` without any."""
    found = [(label, entry) for label, run_dir in run_dirs if str(run_dir) in analysed
             for entry in _entries(run_dir)]
    if not found:
        return [], []
    counts = sorted({int(i["iterations"]) for _, e in found
                     for i in e.get("by_iterations") or []} or {1, 2, 3, 5})
    entropy = Table("Routing: mean coupling entropy (nats) on the test split, by routing "
                    "iterations", [text_column("run"), Column("layer", align="left",
                                                              priority=1),
                                   Column("log J"),
                                   *(Column(f"{n} it.") for n in counts)], [])
    accuracy = Table("Routing: test accuracy with 1 and with 3 routing iterations",
                     [text_column("run"), Column("1 it."), Column("3 it."),
                      Column("difference", short="diff."),
                      Column("same class", short="same")], [])
    data = []
    for label, e in found:
        upper = int(e.get("upper_capsules") or 0)
        log_j = f"{math.log(upper):.4f}" if upper > 1 else "-"
        layer = f"{e.get('layer')} ({e.get('lower_capsules')} -> {upper})"
        entropy.rows.append([label, layer, log_j,
                             *(_value(_at(e, n), "entropy", 4) + ("*" if (_at(e, n) or {})
                               .get("trained") else "") for n in counts)])
        one, three = _at(e, 1), _at(e, 3)
        diff = ("-" if one is None or three is None
                else f"{three['accuracy'] - one['accuracy']:+.4f}")
        accuracy.rows.append([label, _value(one, "accuracy", 4), _value(three, "accuracy", 4),
                              diff, _same(one, three)])
        data.append({"run": label, "layer": e.get("layer"), "lower_capsules":
                     e.get("lower_capsules"), "upper_capsules": upper,
                     "by_iterations": e.get("by_iterations") or []})
    entropy.notes.append("* the count the run was trained with. log J: the entropy of "
                         "uniform couplings over the J upper capsules, the most there is; "
                         "an entropy near it means routing kept the couplings near "
                         "uniform.")
    accuracy.notes.append("1 iteration: uniform couplings, no agreement step. Same class: "
                          "share of test images given the trained count's class (with 1 "
                          "iteration where 3 were trained).")
    return [entropy, accuracy], data


def _same(one: dict[str, Any] | None, three: dict[str, Any] | None) -> str:
    """The 1-iteration agreement when 3 were trained (or the reverse), in percent."""
    if one is None or three is None:
        return "-"
    other = one if three.get("trained") else three if one.get("trained") else None
    value = None if other is None else other.get("agreement")
    return "-" if not isinstance(value, int | float) else f"{100 * value:.1f} %"
