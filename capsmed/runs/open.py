"""Opening a run: the one place that checks a run folder's files belong together and
fit the data they are applied to, for ``capsmed evaluate``, the analyses, ``capsmed
predict``, ``capsmed report`` and the pipeline runner.

:func:`open_run` checks, once and in this order: the checkpoint pair (weights digest,
architecture, arguments and classes against ``config.yaml``); the run's own dataset
file against the content digest ``config.yaml`` recorded; another file's classes and
image shape against the checkpoint's. The returned :class:`OpenRun` then gives the
samples an evaluation scores and the preprocessing record predict replays.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from capsmed.data.contract import DatasetInfo, SplitData, read_info
from capsmed.data.record import RECORD, DatasetRecord, run_record
from capsmed.device import select_device
from capsmed.errors import CapsmedError
from capsmed.runs.checkpoint import load_checkpoint
from capsmed.runs.rows import is_run_file, load_run_split
from capsmed.runs.scores import (
    class_probabilities,
    non_finite_rows,
    predict_scores,
    refuse_non_finite,
)
from capsmed.train.run_config import (
    CONFIG,
    WEIGHTS,
    Unfinished,
    check_dataset_unchanged,
    read_run_config,
    training_unfinished,
)

log = logging.getLogger(__name__)
_REVISION_SAID: set[str] = set()  # runs whose older data revision was said


@dataclass(frozen=True)
class OpenRun:
    """A trained run, checked, with its model loaded (eval mode, on ``device``).

    Attributes:
        run_dir: The run directory.
        model: The checkpoint's model.
        meta: ``checkpoint.json`` (arch, model_kwargs, class_names, data, epoch, ...).
        config: ``config.yaml`` (train, model_kwargs, dataset, environment sections);
            None for a folder holding only a checkpoint.
        device: Where the model lives.
        data_path: The dataset file applied to: the run's own unless another was
            given; None when the run was opened without data (predict).
        info: That file's attributes (None without data).
    """

    run_dir: Path
    model: nn.Module
    meta: dict[str, Any]
    config: dict[str, Any] | None
    device: torch.device
    data_path: Path | None
    info: DatasetInfo | None

    @property
    def arch(self) -> str:
        return str(self.meta["arch"])

    @property
    def epoch(self) -> int:
        return int(self.meta["epoch"])

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(self.meta["class_names"])

    @property
    def loss_kind(self) -> str:
        """How the model's scores become probabilities (the model says)."""
        return str(self.model.loss_kind)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) the model takes."""
        kw = self.meta["model_kwargs"]
        return (int(kw["in_channels"]), *(int(s) for s in kw["input_size"]))

    @property
    def trained_on(self) -> Path:
        """The dataset file the run was trained on (it may be gone)."""
        return Path(self.meta["data"])

    @property
    def unfinished(self) -> Unfinished | None:
        """Why training has not finished (the checkpoint is of an intermediate epoch),
        None once it has (:func:`~capsmed.train.run_config.training_unfinished`)."""
        return training_unfinished(self.run_dir)

    @property
    def own_data(self) -> bool:
        """Whether ``data_path`` is the file the run was trained on (by content)."""
        return self.data_path is not None and is_run_file(self.run_dir, self.data_path)

    def samples(self, split: str = "test") -> SplitData:
        """The samples scored for ``split``: a cross-validation run's ``test`` on its own
        file is its held-out fold; any other split or file is scored whole."""
        if self.data_path is None:
            raise CapsmedError(f"{self.run_dir}: opened without a dataset file")
        return load_run_split(self.run_dir, self.data_path, split)

    def warn_if_unfinished(self, doing: str, command: str) -> None:
        """Warn that the run's training has not finished: its checkpoint is of an
        intermediate epoch (``doing``: "analyses", "predicts with"; ``command``: what to
        run again once it has finished)."""
        late = self.unfinished
        if late is not None:
            log.warning("%s: its training has not finished (%s), so this %s the epoch %s "
                        "checkpoint; %s", self.run_dir, late.reason, doing,
                        self.meta.get("epoch"), late.then(command))

    def predict(self, images: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """Class scores float64 [N, K] of model-ready images: uint8 [N, C, H, W] as the
        dataset file holds them (or one image [C, H, W]). The scores are what predict and
        evaluate report (:func:`capsmed.runs.scores.class_probabilities`): softmax
        probabilities for ConvNets, capsule lengths for capsule networks. Raw images
        of other sizes go through ``capsmed predict``, which replays the preprocessing.

        Raises:
            CapsmedError: images of another dtype or shape than the model takes; a
                NaN or infinite score (corrupt weights), as ``capsmed predict``; a
                ``batch_size`` below 1, as ``capsmed predict --batch-size``.
        """
        if batch_size < 1:  # range() would step past every image: no scores, no error
            raise CapsmedError(f"batch_size must be >= 1, got {batch_size}")
        images = np.asarray(images)
        if images.ndim == 3:
            images = images[None]
        if images.dtype != np.uint8 or images.shape[1:] != self.input_shape:
            shape = "x".join(map(str, self.input_shape))
            raise CapsmedError(f"{self.run_dir}: the model takes uint8 images [N, {shape}] "
                               f"(N, C, H, W), got {images.dtype} {list(images.shape)}")
        if not len(images):  # [0, K], as the scores of any other count are [N, K]
            return np.zeros((0, len(self.class_names)))
        scores = predict_scores(self.model, images, self.device, batch_size)
        # as capsmed predict refuses: a NaN row's argmax is an arbitrary class (the first)
        refuse_non_finite(non_finite_rows(scores), len(scores), self.run_dir / WEIGHTS,
                          "images scored")
        return class_probabilities(scores, self.loss_kind)[0]

    def record(self) -> DatasetRecord:
        """The preprocessing the model was trained with (``preprocessing.json``, else
        the dataset file), checked to describe the checkpoint's classes and input."""
        record = run_record(self.run_dir, self.data_path or self.trained_on)
        if Path(record.origin).name != RECORD and self.config is not None:
            # replayed from a dataset file: only from the one the run was trained on
            check_dataset_unchanged(self.config, self.run_dir, Path(record.origin))
        check_fits(self.meta, record.origin, record.class_names, record.channels,
                   record.image_size)
        self._warn_older_revision()
        return record

    def _warn_older_revision(self) -> None:
        """Say when the run's training file was made by an older data revision: the
        preprocessing replayed now (this capsmed's) makes other images of some inputs
        than training saw (capsmed/data/schema.py says which)."""
        from capsmed.data.schema import DATA_REVISION

        try:
            revision = read_info(self.trained_on).data_revision
        except (CapsmedError, OSError):  # gone or unreadable: nothing to tell
            return
        if revision < DATA_REVISION and str(self.run_dir) not in _REVISION_SAID:
            _REVISION_SAID.add(str(self.run_dir))  # once a process: predict_array loops
            log.warning("%s: trained on images of capsmed's data revision %d (%s); this "
                        "capsmed replays the preprocessing of revision %d, which makes "
                        "other images of some inputs (capsmed/data/schema.py says which)",
                        self.run_dir, revision, self.trained_on, DATA_REVISION)


def check_fits(meta: dict[str, Any], origin: str | Path, class_names: tuple[str, ...] |
               list[str], channels: int, image_size: tuple[int, int] | list[int]) -> None:
    """Refuse data whose classes or image shape differ from the checkpoint's."""
    if list(class_names) != list(meta["class_names"]):
        raise CapsmedError(f"{origin}: classes {list(class_names)} do not match the "
                           f"checkpoint's {list(meta['class_names'])}")
    kw = meta["model_kwargs"]
    expected = (int(kw["in_channels"]), *(int(s) for s in kw["input_size"]))
    if (channels, *image_size) != expected:
        raise CapsmedError(f"{origin}: images are {channels}x{image_size[0]}x"
                           f"{image_size[1]}, the model expects "
                           f"{expected[0]}x{expected[1]}x{expected[2]}")


def open_run(run_dir: Path, data: Path | None = None, device: str | torch.device = "cpu",
             *, need_data: bool = True) -> OpenRun:
    """Load and check ``run_dir``; apply it to ``data`` (default: the run's dataset).

    Args:
        run_dir: A run directory written by ``capsmed train``.
        data: Another ``.h5`` of the same classes and image shape.
        device: ``auto``, ``cpu``, ``cuda``, ``mps`` or a torch device.
        need_data: Open the run's own dataset file, and refuse when it is gone
            (evaluate, analyses). Predict passes False: without ``data`` no dataset
            file is read, and :meth:`OpenRun.record` gives the preprocessing.

    Raises:
        CapsmedError: one line naming the file and what does not fit.
    """
    run_dir = Path(run_dir)
    dev = device if isinstance(device, torch.device) else select_device(device)
    model, meta = load_checkpoint(run_dir, dev)
    config = read_run_config(run_dir) if (run_dir / CONFIG).is_file() else None
    data_path: Path | None = Path(data) if data is not None else Path(meta["data"])
    if data is None and not need_data:
        data_path = None  # predict: the preprocessing record says what it needs
    elif data is None and not data_path.is_file():
        raise CapsmedError(f"{data_path}: the run's dataset file is gone; pass --data "
                           "with a file of the same classes and image size")
    info = None
    if data_path is not None:
        if data is None and config is not None:  # the run's own data, as it was?
            check_dataset_unchanged(config, run_dir, data_path)
        info = read_info(data_path)
        check_fits(meta, data_path, info.class_names, info.channels, info.image_size)
    return OpenRun(run_dir, model, meta, config, dev, data_path, info)
