"""What ``capsmed analyze`` shows: each analysis' result as :class:`capsmed.tables.Table`
models (the CLI prints them fitted to the terminal)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsmed.evaluate.analyses.affine import AffineResult
from capsmed.evaluate.analyses.multimnist import MultiMnistResult
from capsmed.evaluate.analyses.routing import RoutingResult
from capsmed.tables import Column, Table, text_column


def _table(title: str, headers: Sequence[str], rows: list[list[str]],
           notes: Sequence[str] = (), names: int = 1) -> Table:
    """The first ``names`` columns hold names (left, shortened in a narrow terminal)."""
    columns = [text_column(h) if i < names else Column(h) for i, h in enumerate(headers)]
    return Table(title, columns, rows, notes=list(notes))


def affine_table(result: AffineResult, repeats: int, run_dir: Path) -> Table:
    rows = [["untransformed", f"{result.clean_accuracy:.4f}", str(result.samples)],
            ["random affine", f"{result.affine_accuracy:.4f}", str(result.samples * repeats)]]
    rows += [[f"{name} (unchanged {v['unchanged']:.3f})", f"{v['accuracy']:.4f}",
              str(result.samples)] for name, v in result.flips.items()]
    if result.affnist is not None:
        rows.append(["affNIST file", f"{result.affnist['accuracy']:.4f}",
                     str(result.affnist["samples"])])
    worst = min(range(len(result.sweep_angles)), key=result.sweep_accuracy.__getitem__)
    return _table(f"Affine robustness: {run_dir}", ["condition", "accuracy", "images"], rows,
                  [f"rotation sweep: worst {result.sweep_accuracy[worst]:.3f} at "
                   f"{result.sweep_angles[worst]:+.0f} deg; mean applied shift "
                   f"{result.mean_abs_translation_px:.2f} px"])


def multimnist_table(r: MultiMnistResult, split: str) -> Table:
    rows = [["two-digit accuracy", f"{r.two_digit_accuracy:.4f}"],
            ["first digit in top 2", f"{r.first_found:.4f}"],
            ["second digit in top 2", f"{r.second_found:.4f}"]]
    rows += [[f"class {name} found", f"{v:.4f}"] for name, v in r.per_class_found.items()]
    return _table(f"MultiMNIST on {split} ({r.samples} images)", ["measure", "value"], rows)


def routing_tables(results: Sequence[RoutingResult], split: str) -> list[Table]:
    """Per run: the entropy at the first and last logged epoch and on ``split``; then
    per run and true class on ``split``."""
    runs, classes = [], []
    for r in results:
        ends = [f"{p['routing_entropy']:.4f}" for p in (r.curve[:1] + r.curve[-1:])]
        runs.append([r.run_dir, r.arch, f"{r.layer} ({r.lower_capsules}->{r.upper_capsules})",
                     *(ends or ["-", "-"]), f"{r.test_entropy:.4f}", f"{r.test_normalised:.4f}"])
        classes += [[r.run_dir, name, f"{v['entropy']:.4f}", f"{v['normalised']:.4f}"]
                    for name, v in r.per_class.items()]
    normalised = "normalised: the entropy / log J (1: uniform couplings)"
    per_run = Table("Routing coupling entropy (nats)",
                    [text_column("run"), text_column("arch"),
                     text_column("layer (I->J)", priority=1), Column("first epoch"),
                     Column("last epoch"), Column(split), Column("normalised")],
                    runs, notes=["epochs: validation split, as logged", normalised])
    sweep = [[r.run_dir, f"{i['iterations']}" + (" (trained)" if i["trained"] else ""),
              f"{i['accuracy']:.4f}", f"{i['entropy']:.4f}", f"{i['normalised']:.4f}",
              f"{i['agreement']:.4f}"] for r in results for i in r.by_iterations]
    tables = [per_run, _table(f"Routing coupling entropy on {split} by true class (nats)",
                              ["run", "class", "entropy", "normalised"], classes, names=2)]
    if sweep:
        tables.append(_table(
            f"The kept checkpoint with other routing iteration counts ({split})",
            ["run", "iterations", "accuracy", "entropy", "normalised", "same class"],
            sweep, ["1 iteration: uniform couplings, no agreement step; same class: share "
                    "of images given the trained count's class",
                    *(["two digits per image: accuracy is the two-digit accuracy (both in "
                       "the top two), same class compares the top two"]
                      if any(r.two_label for r in results) else [])], names=2))
    return tables


def compactness_table(record: dict[str, Any], run_dir: Path) -> Table:
    rows = [[f, f"{r['score']:.4f}", f"{r['std']:.4f}", str(r["samples"]),
             str(r["undefined"])] for f, r in record["factors"].items()]
    top = next(iter(record["factors"].values()))["max_score"]
    return _table(f"Semantic compactness: {run_dir}",
                  ["factor", "score", "std", "samples", "undefined"], rows,
                  [f"{record['representation']}; maximum log D = {top:.3f}"])


def manifold_table(record: dict[str, Any], run_dir: Path) -> Table:
    rows = [[f"{r['fixed_class']} + moving {r['moving_class']}", f"{r['chamfer']:.4f}",
             f"{r['aligned_error']:.4f}"] for r in record["pairs"]]
    table = _table(f"Manifold (t-SNE, {record['grid_points']} images per pair): {run_dir}",
                   ["fixed + moving", "Chamfer", "aligned error"], rows,
                   [f"{record['representation']}; Chamfer variance "
                    f"{record['chamfer_variance']:.4f}"])
    table.rows.append(["mean", f"{record['chamfer_mean']:.4f}",
                       f"{record['aligned_error_mean']:.4f}"])
    table.total_rows = 1
    return table


def transfer_table(record: dict[str, Any]) -> Table:
    rows = [[r["scheme"], str(r["k"]), r["layers"] or "-", f"{r['accuracy']:.4f}"]
            for r in record["results"]]
    columns = [text_column("scheme"), Column("k"), text_column("frozen layers"),
               Column("accuracy")]
    return Table(f"Layer transfer ({record['arch']}), accuracy on B's test split", columns,
                 rows, notes=[f"base A on A's test split: "
                              f"{record['base_a_accuracy_on_a']:.4f}"])
