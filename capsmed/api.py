"""capsmed as a Python library: the functions behind the commands, one call each.

    import capsmed

    data = capsmed.preprocess("folder", "images/", "shapes.h5", size=28, channels=1,
                              group_pattern=r"^(P\\d+)_")
    run_dir = capsmed.train_run(data, "capsnet", epochs=10)
    report = capsmed.evaluate_run(run_dir).report      # per-class precision, ...
    run = capsmed.load_run(run_dir)                    # the model, its classes, ...
    scores = run.predict(images)                       # uint8 [N, C, H, W] -> [N, K]
    found = capsmed.predict_array(run, photo)          # a raw image, preprocessing replayed
    capsmed.export_run(run_dir, "model.onnx")

(``capsmed.train``, ``capsmed.evaluate`` and ``capsmed.predict`` are the packages; the
functions end in ``_run`` / ``_inputs``.)

Options are the fields of each step's config dataclass (the same names as the command
line's flags, with underscores); see ``capsmed <command> --help``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["evaluate_run", "export_run", "load_run", "predict_array", "predict_inputs",
           "preprocess", "train_run"]


def preprocess(source: str, inputs: Path | str | list[Path], output: Path | str,
               overwrite: bool = False, **options: Any) -> Path:
    """``capsmed preprocess <source>``: raw files -> one dataset file.

    Args:
        source: A registered source (``tupac16``, ``folder``, ``wsi``, ...).
        inputs: Its raw folder (a list of slides and folders for ``wsi``).
        output: The ``.h5`` file to write.
        overwrite: Replace ``output`` if it exists.
        **options: Fields of the source's config (``capsmed preprocess <source>
            --help``), e.g. ``size=28``, ``domain="digits"``.
    """
    from dataclasses import fields

    from capsmed.data.sources import get_source
    from capsmed.data.sources.common import SPLITS
    from capsmed.errors import CapsmedError

    entry = get_source(source)
    if entry.config is not None and "dataset" in {f.name for f in fields(entry.config)}:
        # mnist and fashion-mnist share one config whose ``dataset`` sets the class
        # names; its default is mnist's, so fashion-mnist was written as digits 0-9
        options.setdefault("dataset", source)
        if options["dataset"] != source:
            raise CapsmedError(f"dataset={options['dataset']!r} contradicts the source "
                               f"{source!r}; call capsmed.preprocess({options['dataset']!r}, "
                               "...) instead")
    # the configs use fractions only without split files or folds; as the command line
    # refuses --train/--val/--test with them, a call giving both is refused
    replacing = [k for k in ("split_files", "folds") if options.get(k)]
    if "fractions" in options and replacing:
        raise CapsmedError(f"{replacing[0]} replaces the split fractions; drop fractions, "
                           f"or {replacing[0]}")
    unknown = sorted(set(options.get("split_files") or {}) - set(SPLITS))
    if unknown:  # written as splits of that name, with no train split
        raise CapsmedError(f"split_files: unknown split(s) {', '.join(unknown)} (use "
                           f"{', '.join(SPLITS)})")
    config = entry.config(**options) if entry.config is not None else None
    given = [Path(p) for p in inputs] if isinstance(inputs, list) else Path(inputs)
    return Path(entry.hook("preprocess")(given, Path(output), config, overwrite=overwrite))


def train_run(data: Path | str, arch: str, **options: Any) -> Path:
    """``capsmed train``: one run; returns its directory. ``options`` are the fields of
    :class:`capsmed.train.config.TrainConfig` (``epochs``, ``fraction``, ``out``, ...)."""
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train as run_training

    config = TrainConfig.from_dict({"data": str(data), "arch": arch, **options},
                                   origin="capsmed.train")
    return run_training(config)


def evaluate_run(run_dir: Path | str, **options: Any) -> Any:
    """``capsmed evaluate``: the report of a run (:class:`~capsmed.evaluate.evaluation.
    Evaluation`, written to ``run_dir/report/``); ``options`` as ``evaluate_run``'s."""
    from capsmed.evaluate import evaluation

    return evaluation.evaluate_run(Path(run_dir), **options)


def load_run(run_dir: Path | str, device: str = "cpu") -> Any:
    """A trained run, checked and loaded (:class:`capsmed.runs.OpenRun`): its
    ``model``, ``class_names``, ``input_shape``, ``record()`` of the preprocessing, and
    ``predict(images)`` for model-ready uint8 images [N, C, H, W]. An unfinished run
    (``resume.pt`` there, or no ``summary.json``: an intermediate epoch's checkpoint) is
    loaded with a warning, as ``capsmed predict`` and ``export`` warn."""
    from capsmed.runs import open_run

    run = open_run(Path(run_dir), device=device, need_data=False)
    run.warn_if_unfinished("loads", "load it")
    return run


def predict_inputs(run_dir: Path | str, inputs: list[Path | str] | Path | str,
                   out_dir: Path | str, **options: Any) -> Any:
    """``capsmed predict``: raw images, folders or slides (one path, or a list), their
    preprocessing replayed; writes ``out_dir`` and returns the
    :class:`~capsmed.predict.engine.Prediction`. ``options`` are the fields of
    :class:`~capsmed.predict.config.PredictOptions`."""
    from capsmed.predict.config import PredictOptions
    from capsmed.predict.engine import predict as run_predict

    given = [inputs] if isinstance(inputs, str | Path) else inputs  # not its characters
    return run_predict(Path(run_dir), [Path(p) for p in given], Path(out_dir),
                       PredictOptions(**options))


def predict_array(run: Any, images: Any, **options: Any) -> list[Any]:
    """Class scores of raw images held in memory (NumPy arrays as an image file holds
    them), the run's preprocessing replayed as ``capsmed predict`` replays it on files:
    one :class:`~capsmed.predict.arrays.ArrayPrediction` per image (a row per window
    for patch-level runs). ``run``: a run folder or :func:`load_run`'s result;
    ``options``: ``stride``, ``min_tissue``, ``fov_mask``, ``batch_size``
    (:func:`capsmed.predict.arrays.predict_array`)."""
    from capsmed.predict.arrays import predict_array as run_predict_array

    return run_predict_array(run, images, **options)


def export_run(run_dir: Path | str, output: Path | str, format: str | None = None,
               overwrite: bool = False) -> Path:
    """``capsmed export``: the run's model as an ONNX, TorchScript or ``torch.export``
    file returning its class scores, with its classes and preprocessing as metadata
    (``format`` None: the one ``output``'s suffix names, else ONNX)."""
    from capsmed.runs import export

    return export.export_run(Path(run_dir), output, format, overwrite=overwrite)
