"""Evaluate a run directory on a split of its dataset (or another compatible file)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsmed.data.contract import (
    SECOND_LABEL,
    SplitData,
    checked_second_labels,
    is_two_label,
    read_info,
    read_meta,
    reading,
    warn_if_older_revision,
)
from capsmed.data.digest import file_digest
from capsmed.data.schema import refuse_total_row_name
from capsmed.data.sources import SPLIT_PARAMETERS, source_of
from capsmed.errors import CapsmedError
from capsmed.evaluate.agreement import AgreementResult, orientation_agreement
from capsmed.evaluate.capsule_grids import capsule_grids, write_capsule_grids
from capsmed.evaluate.html import training_facts, write_html
from capsmed.evaluate.metrics import ClassificationReport, classification_report
from capsmed.evaluate.plots import plot_confusion_matrix
from capsmed.evaluate.run_report import tracked_metrics, write_report
from capsmed.io import replace_dir, writing
from capsmed.runs import OpenRun, open_run
from capsmed.runs.rows import is_run_file, read_rows
from capsmed.runs.scores import (
    class_probabilities,
    non_finite_rows,
    predict_scores,
    refuse_non_finite,
)
from capsmed.train.handlers.mlflow_tracking import log_report
from capsmed.train.run_config import WEIGHTS, read_run_config
from capsmed.train.run_data import TRAIN_ROWS

log = logging.getLogger(__name__)

MAX_LOGGED_NOTES = 4


@dataclass(frozen=True)
class Evaluation:
    """A finished evaluation: the report, where it was written and what it describes."""

    report: ClassificationReport
    report_dir: Path
    title: str
    agreement: AgreementResult | None = None
    files: tuple[str, ...] = field(default_factory=tuple)  # names written in report_dir


def _two_label_scores(info: Any, split: str, samples: SplitData, scores: Any
                      ) -> dict[str, Any] | None:
    """For a two-object split (MultiMNIST), paper 004's two-digit accuracy beside the
    per-class report, which scores the first digit only; None for a one-label split."""
    data = info.path
    if split not in info.split_sizes or not is_two_label(data, split):
        return None  # a CV run's test is its held-out fold of split 'all' (one label)
    from capsmed.evaluate.analyses.common import two_digit_hits

    second = checked_second_labels(samples.labels, read_meta(data, split, SECOND_LABEL),
                                   info.num_classes, data, split)
    both, first, other = two_digit_hits(scores, samples.labels, second)
    values = {"two_digit_accuracy": float(both.mean()), "first_digit_found": float(
        first.mean()), "second_digit_found": float(other.mean()),
        "scored": "both digits among the two highest class scores (paper 004 s3.2)"}
    values["note"] = (f"two labels per image ({SECOND_LABEL}): the per-class table and "
                      "accuracy count a prediction right only when it is the first digit; "
                      f"two-digit accuracy (both among the two highest scores) is "
                      f"{values['two_digit_accuracy']:.4f} (report.json: two_label; "
                      "capsmed analyze multimnist gives more)")
    return values


def _preprocessing_differences(run: OpenRun, info: Any) -> dict[str, Any]:
    """How another file's preprocessing differs from the run's own (report.json keys),
    warned about when both come from one source: same classes and shape, but images
    made another way (a patch size, a stain scaling) are not the run's test."""
    from capsmed.data.record import run_record

    try:
        ours = run_record(run.run_dir, run.trained_on)
    except CapsmedError:  # no record and no file: nothing to compare with
        return {"other_data": True}
    if (ours.source_kind or ours.dataset) != (info.source_kind or info.dataset):
        return {"other_data": True, "other_source": info.source_kind or info.dataset}
    try:
        split_only = source_of(info.source_kind, info.dataset, info.preprocessing,
                               info.path).split_parameters
    except CapsmedError:  # a source this capsmed does not know: the shared ones
        split_only = SPLIT_PARAMETERS
    changed = {k: [ours.preprocessing.get(k), info.preprocessing.get(k)]
               for k in sorted(set(ours.preprocessing) | set(info.preprocessing))
               if k not in split_only
               and ours.preprocessing.get(k) != info.preprocessing.get(k)}
    # a capsmed of another data revision makes other images of some raw files
    revision = _trained_revision(run)
    if revision is None:  # the run's file is gone or changed: at least say if old
        warn_if_older_revision(info, "scoring")
    elif revision != info.data_revision:
        changed = {"data_revision": [revision, info.data_revision], **changed}
    if changed:
        log.warning("%s: made with other preprocessing than %s was trained on (%s); "
                    "these scores are not on images like the run's own", info.path,
                    run.run_dir, ", ".join(f"{k}: {a!r} there, {b!r} here"
                                           for k, (a, b) in list(changed.items())[:4])
                    + (", ..." if len(changed) > 4 else ""))
    return {"other_data": True, "preprocessing_differs": changed}


def _trained_revision(run: OpenRun) -> int | None:
    """The data revision of the file the run was trained on; None when that file is
    gone or changed since training."""
    if not run.trained_on.is_file() or not is_run_file(run.run_dir, run.trained_on):
        return None
    return read_info(run.trained_on).data_revision


def _seen_groups_note(run: OpenRun, split: str, split_data: SplitData) -> str | None:
    """A note when another file of the same dataset (a re-preprocessed one, say) puts
    patients the run trained on into the split evaluated (not unseen patients), or when
    that cannot be checked: the run's own file is gone or changed since training, so
    the groups it trained on are unknown."""
    trained_on, info, run_dir = run.trained_on, run.info, run.run_dir
    if run.config is None or info is None:
        return None
    train_split = (run.config.get("dataset") or {}).get("train_split")
    if run.meta.get("dataset") != info.dataset or not train_split:
        return None  # another dataset's group names mean other things
    if not trained_on.is_file() or not is_run_file(run_dir, trained_on):
        state = "is gone" if not trained_on.is_file() else "changed since training"
        return (f"{info.path}: whether its split '{split}' holds cases (patients) "
                f"{run_dir} was trained on cannot be checked: the run's file {trained_on} "
                f"{state}, so these may not be scores on unseen patients")
    with reading(trained_on) as f:
        groups = f[train_split]["groups"].asstr()[...]
    if (run_dir / TRAIN_ROWS).is_file():  # the rows trained on (a fold, a fraction)
        groups = groups[read_rows(run_dir / TRAIN_ROWS, len(groups),
                                  f"{trained_on}'s split '{train_split}'")]
    seen = sorted(set(split_data.groups) & set(groups.tolist()))
    if not seen:
        return None
    return (f"{info.path}: {len(seen)} of the {len(set(split_data.groups))} groups (cases, "
            f"patients) of its split '{split}' are in the training split of {trained_on}, "
            f"which {run_dir} was trained on ("
            + ", ".join(seen[:3]) + (", ..." if len(seen) > 3 else "")
            + "): these are not scores on unseen patients")


def evaluate_run(run_dir: Path, split: str = "test", data: Path | None = None,
                 device: str = "auto", batch_size: int = 512, agreement: bool = False,
                 grids: bool = True, disable_progress: bool | None = None,
                 report_name: str = "report") -> Evaluation:
    """Evaluate the checkpoint in ``run_dir`` on ``split``; write ``run_dir/report/``.

    Args:
        run_dir: A run directory written by ``capsmed train``.
        split: Split of the dataset to evaluate on.
        data: Another ``.h5`` with the same classes and image shape; default: the
            run's own dataset.
        device: ``auto``, ``cpu``, ``cuda``, ``mps``.
        batch_size: Images per forward pass (agreement passes hold batch_size / 8
            images in each of their eight orientations).
        agreement: Also compute paper 001's Agr over the eight orientations.
        grids: Draw reconstruction and capsule perturbation grids when the model has
            a decoder.
        disable_progress: Hide progress bars (None: the global setting).
        report_name: Folder inside ``run_dir`` for the report: keep ``report`` (what
            ``capsmed report`` aggregates) for the run's own test set, and another name
            for an evaluation on other data (e.g. ``report-affnist``).

    Returns:
        The evaluation. Its files are written into a temporary folder beside
        ``run_dir/report_name`` that replaces it only when complete, so a failure (a
        full disk) leaves an earlier report untouched and no partial one.
    """
    if batch_size < 1:
        raise CapsmedError(f"batch size must be >= 1, got {batch_size}")
    if not report_name or Path(report_name).name != report_name or report_name in (".", ".."):
        raise CapsmedError(f"--report-name must be a plain folder name, got '{report_name}'")
    _check_report_folder(Path(run_dir) / report_name)
    run = open_run(run_dir, data, device)
    run_dir, dev, model, meta, info = run.run_dir, run.device, run.model, run.meta, run.info
    assert run.data_path is not None and info is not None  # need_data: refused otherwise
    data_path = run.data_path
    refuse_total_row_name(info.class_names, data_path)  # before scoring: the report needs it
    if agreement and info.image_size[0] != info.image_size[1]:
        raise CapsmedError(f"{data_path}: --agreement needs square images (90-degree "
                           f"rotations), got {info.image_size[0]}x{info.image_size[1]}")
    split_data = run.samples(split)
    log.debug("%s: checkpoint of epoch %s (%s) on %s, %s split '%s': %d samples", run_dir,
              meta["epoch"], meta["arch"], dev, data_path, split, len(split_data))
    if not len(split_data):
        raise CapsmedError(f"{data_path}: split '{split}' has no samples")
    differs: dict[str, Any] = {}
    seen_note = None
    if data is not None and not run.own_data:
        seen_note = _seen_groups_note(run, split, split_data)
        differs = _preprocessing_differences(run, info)

    scores = predict_scores(model, split_data.images, dev, batch_size)
    # before argmax: an image with a NaN score would be counted as an arbitrary class
    refuse_non_finite(non_finite_rows(scores), len(scores), run_dir / WEIGHTS,
                      f"images of split '{split}'")
    probabilities, score_kind = class_probabilities(scores, run.loss_kind)
    report = classification_report(split_data.labels, scores.argmax(axis=1),
                                   info.class_names, scores=probabilities)
    agr = (orientation_agreement(model, split_data.images, split_data.labels, dev,
                                 batch_size, disable_progress) if agreement else None)
    capsules = (capsule_grids(model, split_data.images, split_data.labels,
                              info.num_classes, dev) if grids else None)
    if grids and capsules is None:
        log.info("%s has no reconstruction decoder over class capsules: reconstruction "
                 "and perturbation grids skipped", meta["arch"])

    two_label = _two_label_scores(info, split, split_data, scores)
    if two_label is not None:  # the notes are logged as warnings below
        report.notes.insert(0, two_label["note"])
    if seen_note is not None:  # in the files too: a report.html is sent on its own
        report.notes.insert(0, seen_note)
    late = run.unfinished
    if late is not None:  # in the files too, as a report.html is sent on its own (the
        # notes are logged as warnings below)
        report.notes.insert(0, f"The run's training had not finished ({late.reason}): "
                            f"this scores its epoch {meta['epoch']} checkpoint, not the "
                            f"final one; {late.then('evaluate')}.")
    title = (f"{meta['arch']} on {info.dataset} / {split} (epoch {meta['epoch']})"
             + (f" - {data_path.name}, not the run's file" if differs else "")
             + (" - first digit of two" if two_label is not None else ""))
    report_dir = run_dir / report_name
    context = {"run_dir": str(run_dir), "arch": meta["arch"], "dataset": info.dataset,
               "data": str(data_path), "data_digest": file_digest(data_path),
               "data_revision": info.data_revision,
               "split": split, "checkpoint_epoch": meta["epoch"],
               # the weights scored (checked against the file when loaded): a report
               # of other weights at the same epoch is stale (capsmed runs ls)
               "weights_digest": meta.get("weights_digest"),
               "samples": len(split_data), "auc_scores": score_kind}
    context.update(differs)
    if two_label is not None:
        context["two_label"] = {k: v for k, v in two_label.items() if k != "note"}
    # written beside report_dir and renamed over it only when complete: a full disk or
    # an error leaves the earlier report as it was, and no partial one
    with replace_dir(report_dir) as staging, writing(report_dir):
        _write_files(staging, run_dir, report, title, context, agr, capsules,
                     info.class_names, meta["arch"])
        files = sorted(p.name for p in staging.iterdir() if not p.name.startswith("."))
    # a run trained with --mlflow: its MLflow run gets the report too, another file's
    # numbers under that file's name (not as the run's own test/accuracy, ...)
    prefix = split if report_name == "report" else f"{report_name}/{split}"
    if data is not None and not run.own_data:
        prefix = f"{data_path.stem}/{prefix}"
    log_report(run_dir, tracked_metrics(report, prefix, agr), report_dir, meta["epoch"])
    for note in report.notes[:MAX_LOGGED_NOTES]:
        log.warning(note)
    if len(report.notes) > MAX_LOGGED_NOTES:  # many-class sets: the rest are in the report
        log.warning("... and %d more notes on undefined values in %s",
                    len(report.notes) - MAX_LOGGED_NOTES, report_dir / "report.md")
    return Evaluation(report=report, report_dir=report_dir, title=title, agreement=agr,
                      files=tuple(files))


def _check_report_folder(report_dir: Path) -> None:
    """Refuse a report folder that holds something other than an earlier report: the
    new report replaces the whole folder (``--report-name tensorboard`` would delete the
    run's TensorBoard logs)."""
    if report_dir.is_dir() and not (report_dir / "report.json").is_file() \
            and any(report_dir.iterdir()):
        raise CapsmedError(f"{report_dir}: holds files but no report.json, so it is not an "
                           "earlier report and the report would replace it; choose another "
                           "--report-name")


def _write_files(out: Path, run_dir: Path, report: ClassificationReport, title: str,
                 context: dict[str, Any], agr: AgreementResult | None,
                 capsules: tuple[Any, Any] | None, class_names: tuple[str, ...],
                 arch: str) -> None:
    """The report's files (tables, figures, report.html) in the empty folder ``out``."""
    write_report(report, out, title, context, agr)
    plot_confusion_matrix(report.confusion, class_names, out / "confusion_matrix.png",
                          title=arch)
    figures = [("Confusion matrix", "counts (left) and row-normalised: sensitivity on the "
                "diagonal (right)", out / "confusion_matrix.png"),
               ("Training curves", "loss and accuracy per epoch; dashed: kept checkpoint",
                run_dir / "curves.png")]
    if capsules is not None:
        recon, perturbations = capsules
        paths = write_capsule_grids(recon, perturbations, class_names, out)
        figures.append(("Reconstructions", f"{context['split']} inputs and their "
                        "reconstructions from the predicted class capsule (paper 000 "
                        "Fig. 3)", paths[0]))
        figures += [("Capsule dimension perturbations", f"'{class_names[g.class_index]}'"
                     ": each row shifts one dimension by -0.25..+0.25", p)
                    for g, p in zip(perturbations, paths[1:], strict=True)]
    try:
        config = read_run_config(run_dir)
    except CapsmedError:  # the page without its settings rather than no page
        config = {}
    write_html(out / "report.html", report, title, context, agr, figures,
               training_facts(config))
