"""What a table of runs cannot show, said under it instead of left to the reader.

* A run whose training had not finished (``resume.pt`` still there) scores an early
  checkpoint; averaged silently into a cell it passes for a finished run. Its cell is
  marked :data:`UNFINISHED` and a note names it.
* A run that predicts one class for every test image has learned nothing the table can
  compare (its macro F1 is fixed by the class counts).
* Cells whose runs predicted exactly the same labels (by the digest of the predicted
  labels ``evaluate`` records) cannot differ in any metric computed from the labels,
  whatever they were built to compare: the smoke study's capsnet ``full`` and ``half``
  showed one macro F1 because, after one epoch, both fractions gave the same predictions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from capsmed.evaluate.aggregate import EvaluatedRun

UNFINISHED = "†"


def unfinished(runs: Sequence[EvaluatedRun]) -> list[EvaluatedRun]:
    return [r for r in runs if r.unfinished]


def mark(text: str, runs: Sequence[EvaluatedRun]) -> str:
    """A cell's text, marked when one of its runs had not finished training."""
    return f"{text} {UNFINISHED}" if unfinished(runs) else text


def one_class(run: EvaluatedRun) -> bool:
    """Every test image was given the same class (and the set has several classes)."""
    return len(run.class_names) > 1 and np.count_nonzero(run.confusion.sum(axis=0)) == 1


def _predictions(runs: Sequence[EvaluatedRun]) -> tuple | None:
    """What a cell's runs predicted, as a sorted tuple (None: a report without digest).

    Each run is keyed by its fold too: two CV folds of one size hold other images, so
    the same predicted labels on them (one class everywhere, say) score differently."""
    if not runs or any(r.predictions is None for r in runs):
        return None
    return tuple(sorted((r.data_file, r.dataset, -1 if r.fold is None else r.fold,
                         r.predictions) for r in runs))


def identical_cells(cells: Mapping[str, Sequence[EvaluatedRun]]) -> list[list[str]]:
    """Groups of two or more cells whose runs predicted the same labels, run for run."""
    by_predictions: dict[tuple, list[str]] = {}
    for label, runs in cells.items():
        key = _predictions(runs)
        if key is not None:
            by_predictions.setdefault(key, []).append(label)
    return [labels for labels in by_predictions.values() if len(labels) > 1]


def cell_notes(cells: Mapping[str, Sequence[EvaluatedRun]]) -> list[str]:
    """The notes a table of these cells needs: unfinished runs, one-class runs and cells
    resting on identical predictions."""
    runs = list({r.path: r for rs in cells.values() for r in rs}.values())
    notes = []
    late = unfinished(runs)
    if late:
        notes.append(f"{UNFINISHED}: the cell averages {len(late)} run(s) whose training "
                     "had not finished: " + "; ".join(f"{r.path} ({r.unfinished})"
                                                      for r in late)
                     + "; finish each with capsmed train --resume RUN_DIR (one whose "
                     "resumable state was removed: train it again), then capsmed "
                     "evaluate RUN_DIR")
    flat = [r for r in runs if one_class(r)]
    if flat:
        notes.append(f"{len(flat)} run(s) predict one class for every test image (they "
                     "learned nothing these metrics can compare): "
                     + ", ".join(str(r.path) for r in flat))
    for labels in identical_cells(cells):
        notes.append(f"{' and '.join(labels)} rest on identical predictions (run for run, "
                     "the same label for every test image), so no metric computed from "
                     "the labels can differ between them; train longer or on more data "
                     "for the table to show their difference")
    return notes
