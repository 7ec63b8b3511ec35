"""The papers' table layouts, filled from grouped runs.

* :func:`metric_table`: paper 000 Table 2 -- rows are datasets, columns protocol x
  architecture, cells the mean +- std of one metric (paper 000 reports F1).
* :func:`per_class_tables`: paper 001 Table 2 -- per class precision and sensitivity
  for each architecture, pooled over CV folds (or mean +- std over them), with the
  Total row as the unweighted mean over classes.
* :func:`significance_table`: the pairwise paired tests.
* :func:`groups_table`: every group and every overall metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from capsmed.evaluate.aggregate import EvaluatedRun, Group, Stat, order_metrics
from capsmed.evaluate.caveats import cell_notes, mark, unfinished
from capsmed.evaluate.per_class import mean_per_class, pooled_per_class
from capsmed.evaluate.significance import TEST_NAMES, PairedTest, p_decimals
from capsmed.tables import PLUS_MINUS, Column, Table, text_column
from capsmed.train.protocol import protocol_sort_key

# a CV run's held-out rows: capsmed.train.run_data.TEST_ROWS (which imports torch)
TEST_ROWS = "test_indices.npy"

METRIC_TITLES = {"macro_f1": "Macro F1", "accuracy": "Accuracy",
                 "balanced_accuracy": "Balanced accuracy",
                 "macro_precision": "Macro precision",
                 "macro_sensitivity": "Macro sensitivity",
                 "macro_specificity": "Macro specificity", "weighted_f1": "Weighted F1",
                 "auc": "AUC", "macro_auc": "Macro AUC", "agreement": "Agreement (Agr)"}
MISSING = "-"
UNDEFINED = "n/a"


def metric_title(metric: str) -> str:
    return METRIC_TITLES.get(metric, metric)


def format_stat(stat: Stat | None, digits: int = 3, show_n: bool = False,
                missing: str = MISSING) -> str:
    """``0.912 ± 0.004`` (std omitted below 2 values; ``(n=k)`` appended on request)."""
    if stat is None:
        return missing
    text = f"{stat.mean:.{digits}f}"
    if stat.std is not None:
        text += f" {PLUS_MINUS} {stat.std:.{digits}f}"
    return text + (f" (n={stat.n})" if show_n else "")


def _n_note(counts: Sequence[int]) -> tuple[bool, str]:
    """Whether cells must show their own n, and the note saying what n is."""
    if len(set(counts)) == 1:
        n = counts[0]
        std = "sample std" if n > 1 else "no std with one run"
        return False, f"n = {n} run(s) per cell ({std}, ddof=1)"
    return True, "n differs between cells: shown in each (sample std, ddof=1)"


def _by_setting(groups: Sequence[Group]) -> dict[tuple[str, str], list[Group]]:
    buckets: dict[tuple[str, str], list[Group]] = {}
    for g in groups:
        buckets.setdefault((g.dataset, g.protocol), []).append(g)
    return buckets


def metric_table(groups: Sequence[Group], metric: str, digits: int = 3,
                 archs: Sequence[str] = ()) -> Table:
    """Paper 000 Table 2: datasets x (protocol x architecture), mean +- std of ``metric``.

    Under each protocol the architectures are in the order of ``archs`` (``--arch``),
    else alphabetical, the same in every dataset's row."""
    datasets = list(dict.fromkeys(g.dataset for g in groups))
    protocols = sorted({g.protocol: g.settings for g in groups}.items(),
                       key=lambda item: protocol_sort_key(item[1]))
    rank = {a: i for i, a in enumerate(archs)}
    columns = [(p, a) for p, _ in protocols
               for a in sorted({g.arch for g in groups if g.protocol == p},
                               key=lambda a: (rank.get(a, len(rank)), a))]
    cell = {(g.dataset, g.protocol, g.arch): g.stat(metric) for g in groups}
    runs = {(g.dataset, g.protocol, g.arch): g.runs for g in groups}
    stats = [s for s in cell.values() if s is not None]
    show_n, n_note = _n_note([s.n for s in stats])
    rows, csv_rows = [], []
    for d in datasets:
        found = [cell.get((d, p, a)) for p, a in columns]
        rows.append([d, *(mark(format_stat(cell.get((d, p, a)), digits, show_n),
                               runs.get((d, p, a), ())) for p, a in columns)])
        # unfinished: runs of the cell whose training had not finished (the † of the
        # other formats), so a CSV reader sees it too
        csv_rows.append([d, *(v for s, (p, a) in zip(found, columns, strict=True) for v in
                              ((s.mean, s.std, s.n,
                                len(unfinished(runs.get((d, p, a), ()))))
                               if s else (None, None, None, None)))])
    csv_columns = ["dataset"] + [f"{p} / {a} {k}" for p, a in columns
                                 for k in ("mean", "std", "n", "unfinished")]
    return Table(
        title=f"{metric_title(metric)}: mean {PLUS_MINUS} std over repetitions "
              "(paper 000 Table 2 layout)",
        columns=[text_column("Dataset"), *(Column(a, span=p) for p, a in columns)],
        rows=rows,
        notes=[n_note, f"'{MISSING}': no evaluated run for that dataset, protocol and "
               "architecture", *cell_notes({f"{d}, {p} / {a}": rs
                                            for (d, p, a), rs in runs.items()})],
        csv_columns=csv_columns, csv_rows=csv_rows, label=f"metric-{metric}")


def _fewer(stat: Stat | None, group: Group) -> bool:
    """Whether ``stat`` is over fewer runs than ``group`` has (undefined in the others)."""
    return stat is not None and stat.n != len(group.runs)


def _repetitions(group: Group) -> str:
    return ", ".join(r.repetition_label for r in group.runs)


def _images_column(members: Sequence[Group],
                   supports: list[list[int]]) -> tuple[list[int], list[str]]:
    """Paper 001's Images column: the test samples per class, and what they are."""
    runs = [r for g in members for r in g.runs]
    test_sets = {tuple(int(v) for v in r.confusion.sum(axis=1)) for r in runs}
    # seeds on one test split: show it, not n times it. Equal counts alone do not show
    # that: stratified CV folds hold as many images of each class, but other images.
    if len(test_sets) == 1 and all(r.fold is None for r in runs):
        images = list(next(iter(test_sets)))
        return images, [f"Images: test samples per class; every run was tested on the "
                        f"same {sum(images):,} images"]
    # CV folds: the summed test sets are the whole dataset, as in paper 001
    folds = [r.fold for r in members[0].runs]
    once = ("every image once" if len(folds) == len(set(folds)) else
            "every image once per repetition of its fold")
    if _over_limit_in_every_fold(runs):
        once = ("each fold's images once, but the images beyond the per-class limit are "
                "in every fold's test set and count once per run: more than the dataset "
                "holds")
    notes = [f"Images: test samples summed over the runs (over CV folds: {once})"]
    if any(s != supports[0] for s in supports):
        notes.append("the architectures were tested on different numbers of images; "
                     f"Images shows {members[0].arch}'s")
    return supports[0], notes


def _over_limit_in_every_fold(runs: Sequence[EvaluatedRun]) -> bool:
    """CV runs with ``--per-class-limit`` whose held-out rows (``test_indices.npy``)
    overlap between folds: the images beyond the limit are tested by every fold
    (:func:`capsmed.data.challenges.cv_partition`), so the summed folds count them more
    than once."""
    tested: list[tuple[int, np.ndarray]] = []
    for r in runs:
        path = Path(r.path) / TEST_ROWS
        if r.fold is None or r.settings.get("per_class_limit") is None \
                or not path.is_file():
            continue
        try:
            rows = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):
            continue
        if any(fold != r.fold and np.intersect1d(rows, other).size
               for fold, other in tested):
            return True
        tested.append((r.fold, rows))
    return False


def per_class_tables(groups: Sequence[Group], mode: str = "pooled",
                     digits: int = 3) -> list[Table]:
    """Paper 001 Table 2 per (dataset, protocol): per-class PRE and SEN per architecture.

    Args:
        groups: Grouped runs.
        mode: ``pooled`` sums the repetitions' confusion matrices before computing
            PRE/SEN (paper 001 over its 5 CV folds); ``mean`` averages each run's
            per-class values (mean +- std).
        digits: Decimals shown.
    """
    if mode not in ("pooled", "mean"):
        raise ValueError(f"mode must be 'pooled' or 'mean', got {mode!r}")
    tables = []
    for (dataset, protocol), members in _by_setting(groups).items():
        names = members[0].class_names
        columns = [text_column("Class"), Column("Images")]
        notes = []
        if mode == "pooled":
            results = [pooled_per_class(g.runs) for g in members]
            notes.append("Pooled: each architecture's confusion matrices summed over its "
                         "runs, then PRE = TP/(TP+FP) and SEN = TP/(TP+FN); over CV folds "
                         + ("the images beyond the per-class limit count once per fold"
                            if _over_limit_in_every_fold([r for g in members for r in g.runs])
                            else "every image counts once (paper 001)"))
            supports = [[r["per_class"][n]["support"] for n in names] for r in results]
            notes += [f"{g.arch}: {note}" for g, r in zip(members, results, strict=True)
                      for note in r["notes"]]
        else:
            results = [mean_per_class(g.runs) for g in members]
            notes.append(f"Mean {PLUS_MINUS} sample std of each run's per-class values "
                         "over the runs of each architecture; (n=k): over the k runs where "
                         "the value is defined (the class is in their test set, or for "
                         "precision predicted there)")
            supports = [[r["support"][n] for n in names] for r in results]
        notes.append("Total: unweighted mean over classes where defined (paper 001)")
        images, image_notes = _images_column(members, supports)
        notes += image_notes
        notes += [f"{g.arch}: {len(g.runs)} run(s) ({_repetitions(g)})" for g in members]
        notes += cell_notes({g.arch: g.runs for g in members})
        for g in members:
            columns += [Column("Precision", span=mark(g.arch, g.runs), short="PRE"),
                        Column("Sensitivity", span=mark(g.arch, g.runs), short="SEN")]
        rows, csv_rows = [], []
        for k, name in enumerate([*names, "Total"]):
            is_total = k == len(names)  # by place: a class may be named Total
            row = [name, f"{sum(images) if is_total else images[k]:,}"]
            for g, r, support in zip(members, results, supports, strict=True):
                values = r["total"] if is_total else r["per_class"][name]
                n_images = sum(support) if is_total else support[k]
                if mode == "pooled":
                    pre, sen = values["precision"], values["sensitivity"]
                    row += [UNDEFINED if v is None else f"{v:.{digits}f}" for v in (pre, sen)]
                    csv_rows.append([dataset, protocol, g.arch, name, n_images, pre, sen,
                                     len(g.runs), len(unfinished(g.runs))])
                else:
                    pre, sen = values.get("precision"), values.get("sensitivity")
                    # a class absent from a run's test set has no sensitivity there: its
                    # mean is over fewer runs than the architecture has, and says so
                    row += [format_stat(s, digits, show_n=_fewer(s, g), missing=UNDEFINED)
                            for s in (pre, sen)]
                    csv_rows.append([dataset, protocol, g.arch, name, n_images,
                                     *(v for s in (pre, sen) for v in
                                       ((s.mean, s.std, s.n) if s else (None, None, 0))),
                                     len(g.runs), len(unfinished(g.runs))])
            rows.append(row)
        csv_columns = (["dataset", "protocol", "arch", "class", "support_total", "precision",
                        "sensitivity", "runs", "unfinished_runs"] if mode == "pooled" else
                       ["dataset", "protocol", "arch", "class", "support_total",
                        "precision_mean", "precision_std", "precision_n",
                        "sensitivity_mean", "sensitivity_std", "sensitivity_n", "runs",
                        "unfinished_runs"])
        how = "pooled over runs" if mode == "pooled" else f"mean {PLUS_MINUS} std over runs"
        tables.append(Table(
            title=f"{dataset} / {protocol}: precision and sensitivity per class, {how} "
                  "(paper 001 Table 2 layout)",
            columns=columns, rows=rows, total_rows=1, notes=notes,
            csv_columns=csv_columns, csv_rows=csv_rows,
            label=f"per-class-{mode}-{len(tables) + 1}"))
    return tables


def _p_text(p: float | None, alpha: float) -> str:
    """``p`` in 4 decimals, more where 4 would round it across ``alpha`` (0.04996 shown
    ``0.0500`` beside its ``*`` for p < 0.05)."""
    if p is None:
        return "n/a"
    return "<0.0001" if p < 1e-4 else p_decimals(p, alpha, 4)


def significance_table(tests: Sequence[PairedTest], notes: Sequence[str], test: str,
                       alpha: float, digits: int = 3) -> Table | None:
    """Pairwise paired tests, ``*`` where p < alpha; None when nothing was compared."""
    if not tests:
        return None
    metric = tests[0].metric
    rows, csv_rows = [], []
    def mean(value: float | None) -> str:
        return MISSING if value is None else f"{value:.{digits}f}"

    for t in tests:
        flag = "n/a" if t.significant is None else ("*" if t.significant else "")
        rows.append([t.dataset, t.protocol, t.arch_a, t.arch_b, str(t.n), mean(t.mean_a),
                     mean(t.mean_b), MISSING if t.mean_difference is None
                     else f"{t.mean_difference:+.{digits}f}", _p_text(t.p_value, alpha), flag])
        csv_rows.append([t.dataset, t.protocol, t.arch_a, t.arch_b, t.metric, t.test, t.n,
                         t.mean_a, t.mean_b, t.mean_difference, t.statistic, t.p_value,
                         t.significant, t.note])
    na = sorted({t.note for t in tests if t.p_value is None})
    return Table(
        title=f"{TEST_NAMES[test]} on {metric_title(metric)}, pairs matched by seed and "
              f"fold (* p < {alpha:g})",
        columns=[text_column("Dataset"), text_column("Protocol"), text_column("A"),
                 text_column("B"), Column("n"), Column("mean A", priority=1),
                 Column("mean B", priority=1), Column("A - B"), Column("p"),
                 Column(f"p<{alpha:g}")],
        rows=rows,
        notes=["two-sided; p-values are not corrected for multiple comparisons; mean A and "
               "mean B are over the matched pairs only",
               *na, *notes],
        csv_columns=["dataset", "protocol", "arch_a", "arch_b", "metric", "test", "n",
                     "mean_a", "mean_b", "mean_difference", "statistic", "p_value",
                     "significant", "note"],
        csv_rows=csv_rows, label=f"significance-{metric}")


def groups_table(groups: Sequence[Group], digits: int = 3) -> Table:
    """Every group with every overall metric (mean +- std); CSV adds per-class metrics."""
    metrics = order_metrics({m for g in groups for m in g.metric_names()})
    rows, csv_rows = [], []
    for g in groups:
        stats = {m: g.stat(m) for m in metrics}
        rows.append([g.dataset, g.protocol, mark(g.arch, g.runs), str(len(g.runs)),
                     *(format_stat(stats[m], digits, show_n=_fewer(stats[m], g))
                       for m in metrics)])
        late = len(unfinished(g.runs))
        csv_rows += [[g.dataset, g.protocol, g.arch, "", m, s.mean, s.std, s.n, late]
                     for m, s in stats.items() if s is not None]
        per_class = mean_per_class(g.runs)["per_class"]
        csv_rows += [[g.dataset, g.protocol, g.arch, name, m, s.mean, s.std, s.n, late]
                     for name, values in per_class.items() for m, s in values.items()
                     if s is not None]
    return Table(
        title=f"Every group: mean {PLUS_MINUS} sample std over its runs ((n=k): over the k "
              "runs where the metric is defined)",
        columns=[text_column("Dataset"), text_column("Protocol"), text_column("Arch"),
                 Column("n"), *(Column(metric_title(m)) for m in metrics)],
        rows=rows, notes=cell_notes({f"{g.dataset}, {g.protocol} / {g.arch}": g.runs
                                     for g in groups}),
        csv_columns=["dataset", "protocol", "arch", "class", "metric", "mean", "std", "n",
                     "unfinished"],
        csv_rows=csv_rows, label="groups")
