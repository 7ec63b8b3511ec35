"""``capsmed predict``: a trained run applied to new images, folders and slides.

Each input is read and cut into windows by its run's recipe (the training
preprocessing, replayed), the windows are scored in batches of ``batch_size`` that run
across inputs (so scores do not depend on how the windows were grouped into files),
and per input a heatmap and a QuPath GeoJSON are written; ``predictions.csv`` and
``summary.json`` follow. Everything goes into a temporary folder renamed into place at
the end: an error leaves no partial output.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capsmed.data.images import exif_orientation
from capsmed.data.record import RECORD, DatasetRecord
from capsmed.data.replay import make_recipe
from capsmed.data.replay.windows import Prepared
from capsmed.data.schema import class_index
from capsmed.device import select_device
from capsmed.errors import CapsmedError
from capsmed.io import (
    atomic_dir,
    ensure_writable_dir,
    output_lock,
    replace_dir,
    stale_partial_dirs,
    write_text_atomic,
    writing,
)
from capsmed.predict.config import SHAPES, PredictOptions
from capsmed.predict.inputs import (
    InputFile,
    check_out_dir,
    gather_inputs,
    match_centres,
    read_centres,
)
from capsmed.predict.outputs import (
    InputResult,
    geojson,
    positives,
    write_geojson,
    write_heatmap,
    write_predictions_csv,
)
from capsmed.progress import make_progress, restart_task
from capsmed.runs import open_run
from capsmed.runs.rows import is_run_file
from capsmed.runs.scores import (
    class_probabilities,
    non_finite_rows,
    predict_scores,
    refuse_non_finite,
)
from capsmed.train.run_config import WEIGHTS

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """A finished prediction: what was written and what failed."""

    out_dir: Path
    results: list[InputResult]
    failed: list[dict[str, str]]
    class_name: str
    threshold: float
    counts: dict[str, int]
    positives: int = 0
    per_input: list[dict[str, Any]] = field(default_factory=list)
    windowed: bool = True  # False: one prediction per image, no class/threshold/positives


@dataclass
class _Open:
    """An input whose windows are being scored."""

    item: InputFile
    prepared: Prepared
    pushed: int = 0
    closed: bool = False
    error: str | None = None
    scores: list[np.ndarray] = field(default_factory=list)
    centres: list[np.ndarray] = field(default_factory=list)

    @property
    def scored(self) -> int:
        return sum(len(s) for s in self.scores)


class _BatchScorer:
    """Windows in, scores out, in order, in batches that run across inputs; counts the
    windows scored and those with a NaN or infinite score."""

    def __init__(self, model: torch.nn.Module, device: torch.device, batch_size: int) -> None:
        self.model, self.device, self.batch_size = model, device, batch_size
        self.buffer: list[np.ndarray] = []
        self.scored = self.non_finite = 0

    def push(self, images: np.ndarray) -> list[np.ndarray]:
        self.buffer.append(images)
        return self._run(final=False)

    def flush(self) -> list[np.ndarray]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[np.ndarray]:
        held = sum(len(b) for b in self.buffer)
        if not held or (held < self.batch_size and not final):
            return []
        stack = np.concatenate(self.buffer)
        cut = len(stack) if final else len(stack) // self.batch_size * self.batch_size
        self.buffer = [stack[cut:]] if cut < len(stack) else []
        batches = [predict_scores(self.model, stack[i:i + self.batch_size], self.device,
                                  self.batch_size) for i in range(0, cut, self.batch_size)]
        self.scored += sum(len(b) for b in batches)
        self.non_finite += sum(non_finite_rows(b) for b in batches)
        return batches

    def check_finite(self, checkpoint: Path, windowed: bool) -> None:
        """Refuse once a window got a NaN or infinite score: its class would be
        arbitrary (outside the inputs' try, so --keep-going does not pass it)."""
        refuse_non_finite(self.non_finite, self.scored, checkpoint,
                          "windows scored" if windowed else "images scored")


def _class_index(record: DatasetRecord, name: str | None) -> int:
    names = list(record.class_names)
    if name is None:
        return 1 if len(names) > 1 else 0
    index = class_index(names, name)
    if index is None:
        raise CapsmedError(f"--class '{name}' is not a class of this run (classes: "
                           f"{', '.join(names)})")
    return index


def _check_options(options: PredictOptions) -> None:
    if options.batch_size < 1:
        raise CapsmedError(f"--batch-size must be >= 1, got {options.batch_size}")
    if not 0.0 <= options.threshold <= 1.0:  # NaN too: scores are probabilities
        raise CapsmedError(f"--threshold must be within [0, 1] (class scores are "
                           f"probabilities or capsule lengths), got {options.threshold}")
    if options.shape not in SHAPES:
        raise CapsmedError(f"--shape must be one of {', '.join(SHAPES)}, got {options.shape!r}")


def predict(run_dir: Path, inputs: list[Path], out_dir: Path,
            options: PredictOptions | None = None) -> Prediction:
    """Apply the checkpoint in ``run_dir`` to ``inputs``; write ``out_dir``.

    Args:
        run_dir: A run directory written by ``capsmed train``.
        inputs: Image files, folders (searched recursively) and slides.
        out_dir: New (or empty) folder for predictions.csv, summary.json, heatmaps/
            and geojson/; with ``options.overwrite`` an existing one is replaced.
        options: See :class:`PredictOptions`.

    Returns:
        The prediction. Unreadable inputs stop it with nothing written, unless
        ``keep_going``: then they are listed in ``failed`` and summary.json.
    """
    opts = options or PredictOptions()
    _check_options(opts)
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run = open_run(run_dir, opts.data, select_device(opts.device), need_data=False)
    run.warn_if_unfinished("predicts with", "predict")  # as evaluate and export warn
    model, meta, device = run.model, run.meta, run.device
    record = run.record()
    if opts.data is not None and Path(record.origin).name == RECORD \
            and not is_run_file(run_dir, opts.data):
        # the run's own record is replayed: another file given here was ignored
        raise CapsmedError(f"{opts.data}: --data is for runs without {RECORD}; {run_dir} "
                           f"has one and predicts with the preprocessing it records (not "
                           f"this file's): drop --data")
    recipe = make_recipe(record, opts.overrides)
    log.debug("run %s (%s, epoch %s) on %s: recipe %s, preprocessing from %s", run_dir,
              meta["arch"], meta["epoch"], device, type(recipe).__name__, record.origin)
    class_index = _class_index(record, opts.class_name)
    if opts.centres is not None and not recipe.windowed:
        raise CapsmedError(f"--centres applies to patch and slide runs; this run (dataset "
                           f"{record.dataset!r}) predicts one class per image")
    grid_only = [flag for flag, value in (("--stride", opts.overrides.stride),
                                          ("--min-tissue", opts.overrides.min_tissue))
                 if value is not None]
    if opts.centres is not None and grid_only:  # the given windows are scored as given
        raise CapsmedError(f"{opts.centres}: {' and '.join(grid_only)} choose the windows "
                           "of a grid; with --centres the windows are the given ones")
    if not recipe.windowed and (opts.class_name is not None
                                or opts.threshold != PredictOptions.threshold):
        raise CapsmedError(f"--class and --threshold apply to patch and slide runs; this "
                           f"run (dataset {record.dataset!r}) predicts one class per "
                           "image, its highest-scoring one")
    if not recipe.windowed and opts.shape != PredictOptions.shape:
        raise CapsmedError(f"--shape applies to patch and slide runs (their GeoJSON); this "
                           f"run (dataset {record.dataset!r}) predicts one class per image "
                           "and writes no GeoJSON")
    centres = read_centres(opts.centres) if opts.centres is not None else {}
    items = gather_inputs(inputs, slides=recipe.slides)
    if centres:
        centres = match_centres(centres, items, opts.centres)
    if out_dir.exists() and not out_dir.is_dir():
        raise CapsmedError(f"{out_dir}: exists and is not a folder")
    check_out_dir(out_dir, inputs, items, [run_dir, *(p for p in (
        opts.centres, opts.data, opts.overrides.fov_mask) if p is not None)], opts.overwrite)
    staging_of = replace_dir if opts.overwrite else atomic_dir
    ensure_writable_dir(out_dir.parent)
    with output_lock(out_dir):
        for stale in stale_partial_dirs(out_dir):  # a predict killed before it finished
            log.info("removing %s, left by a predict that was killed", stale)
            shutil.rmtree(stale, ignore_errors=True)
        with staging_of(out_dir) as staging, writing(out_dir):
            done = _predict_all(model, meta, record, recipe, items, centres, class_index,
                                opts, device, staging, run_dir / WEIGHTS)
            write_predictions_csv(staging / "predictions.csv", done.results,
                                  record.class_names)
            write_text_atomic(staging / "summary.json", json.dumps(
                _summary(run_dir, meta, record, done, opts, class_index), indent=2,
                default=str) + "\n")
    done.out_dir = out_dir
    return done


def _predict_all(model: torch.nn.Module, meta: dict[str, Any], record: DatasetRecord,
                 recipe: Any, items: list[InputFile], centres: dict[str, np.ndarray],
                 class_index: int, opts: PredictOptions, device: torch.device,
                 staging: Path, checkpoint: Path) -> Prediction:
    scorer = _BatchScorer(model, device, opts.batch_size)
    queue: deque[_Open] = deque()
    turned: list[str] = []  # inputs with an EXIF orientation other than upright
    done = Prediction(staging, [], [], record.class_names[class_index], opts.threshold,
                      {name: 0 for name in record.class_names}, windowed=recipe.windowed)

    def drain() -> None:
        while queue and queue[0].closed and queue[0].scored == queue[0].pushed:
            _finish(queue.popleft(), meta, record, class_index, opts, staging, done)

    def deliver(batches: list[np.ndarray]) -> None:
        for scores in batches:  # rows in push order: fill the inputs first in, first out
            while len(scores):
                head = queue[0]
                take = head.pushed - head.scored
                if take <= 0:
                    raise RuntimeError("scores arrived for no pushed window")
                head.scores.append(scores[:take])
                scores = scores[take:]
                drain()

    with make_progress(disable=opts.disable_progress) as progress:
        overall = progress.add_task("inputs", total=len(items))
        windows = progress.add_task("windows", total=None)
        for item in items:
            entry = _Open(item, Prepared((0, 0), 0.0, iter(()), 0))
            queue.append(entry)
            try:
                entry.prepared = recipe.prepare(item.path, centres.get(item.name))
                windows = restart_task(progress, windows, item.path.name[:30],
                                       entry.prepared.expected)
                for chunk, xy in entry.prepared.chunks:
                    entry.centres.append(xy)
                    entry.pushed += len(chunk)
                    deliver(scorer.push(chunk))
                    progress.advance(windows, len(chunk))
            except CapsmedError as exc:
                if not opts.keep_going:
                    raise
                log.error("%s", exc)
                entry.error = str(exc)
            entry.closed = True
            if entry.error is None and exif_orientation(item.path) != 1:
                turned.append(item.path.name)
            drain()
            progress.advance(overall)
            scorer.check_finite(checkpoint, recipe.windowed)  # a corrupt checkpoint: stop early
        deliver(scorer.flush())
        scorer.check_finite(checkpoint, recipe.windowed)
        drain()
    if turned:  # as preprocess warns about its images: a viewer shows these turned
        log.warning("%d input(s) carry an EXIF orientation (%s%s) that is not applied: "
                    "they are scored as their pixels lie, as training read its images; "
                    "rotate the files first if the camera's view matters", len(turned),
                    ", ".join(turned[:3]), ", ..." if len(turned) > 3 else "")
    return done


def _finish(entry: _Open, meta: dict[str, Any], record: DatasetRecord, class_index: int,
            opts: PredictOptions, staging: Path, done: Prediction) -> None:
    """An input whose windows are all scored: its heatmap, GeoJSON and counts."""
    if entry.error is not None:
        done.failed.append({"input": entry.item.name, "error": entry.error})
        return
    p = entry.prepared
    raw = (np.concatenate(entry.scores) if entry.scores
           else np.empty((0, len(record.class_names)), np.float32))
    probabilities, _ = class_probabilities(raw, meta["loss_kind"])
    xy = np.concatenate(entry.centres) if entry.centres else np.empty((0, 2), np.int64)
    result = InputResult(name=entry.item.name, size=p.size, x=xy[:, 0],
                         y=xy[:, 1], footprint=p.footprint, scores=probabilities,
                         thumbnail=p.thumbnail, windowed=p.windowed,
                         class_index=class_index, threshold=opts.threshold)
    for k in result.predicted.tolist():
        done.counts[record.class_names[k]] += 1
    extra: dict[str, Any] = {"input": entry.item.name, "windows": len(raw), **p.notes}
    if p.windowed:
        hits = int(positives(result, class_index, opts.threshold).sum())
        done.positives += hits
        heatmap = Path("heatmaps") / f"{entry.item.stem}.png"
        features = Path("geojson") / f"{entry.item.stem}.geojson"
        for folder in ("heatmaps", "geojson") if opts.heatmaps else ("geojson",):
            (staging / folder).mkdir(exist_ok=True)
        write_geojson(staging / features, geojson(result, record.class_names, class_index,
                                                  opts.threshold, opts.shape))
        drawn = opts.heatmaps and len(raw) > 0
        if drawn:
            write_heatmap(staging / heatmap, result, record.class_names, class_index,
                          opts.threshold)
        extra.update(positives=hits, geojson=str(features),
                     heatmap=str(heatmap) if drawn else None)
    result.thumbnail = None  # the CSV needs none; a folder of images must not pile them up
    done.results.append(result)
    done.per_input.append(extra)


def _summary(run_dir: Path, meta: dict[str, Any], record: DatasetRecord, done: Prediction,
             opts: PredictOptions, class_index: int) -> dict[str, Any]:
    _, score_kind = class_probabilities(np.zeros((0, len(record.class_names))),
                                        meta["loss_kind"])
    # an image-level run has no --class, --threshold or positives (None): its images are
    # their highest-scoring class, and 0 "positives" of a class would read as a finding
    call = {"class": done.class_name, "class_index": class_index,
            "threshold": opts.threshold, "geojson_shape": opts.shape}
    if not done.windowed:
        call = dict.fromkeys(call)
    return {
        "run_dir": str(run_dir), "arch": meta["arch"], "checkpoint_epoch": meta["epoch"],
        "dataset": record.dataset, "class_names": list(record.class_names),
        "preprocessing_from": record.origin, "preprocessing": record.preprocessing,
        "overrides": {k: v for k, v in asdict(opts.overrides).items() if v is not None},
        "scores": score_kind, **call,
        "decision": f"a window is '{done.class_name}' when its {done.class_name} score is "
                    f">= {opts.threshold}, else its highest-scoring other class"
                    if done.windowed else "an image's prediction is its highest-scoring "
                    "class",
        "inputs": len(done.results), "windows": sum(len(r.x) for r in done.results),
        "predicted_counts": done.counts,
        "positives": done.positives if done.windowed else None,
        "per_input": done.per_input, "failed": done.failed,
    }
