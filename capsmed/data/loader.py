"""Batches for training and evaluation: held on the device, or streamed from HDF5.

Both loaders take the same index batches (from :class:`capsmed.train.sampling.BatchSampler`
or :func:`sequential_batches`) and yield ``(images in [0, 1] float32, labels)`` on the
device, so the training loop does not know which one it has.

* :class:`DeviceSplit`: the split lives on the device as uint8 (a 60K x 28 x 28 set is
  47 MB) and batches are sliced there: no host-device copy, no worker processes.
* :class:`StreamingSplit`: for sets too large to hold, a ``DataLoader`` whose workers
  each open their own h5py handle (h5py handles cannot be shared across processes)
  and read each batch with one sorted fancy-index read.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from capsmed.data.loading import LOADINGS
from capsmed.errors import CapsmedError, first_line

log = logging.getLogger(__name__)

# ``auto`` holds a split on the device when it takes less than this share of the
# device's free memory (CUDA) or of a fixed host budget (CPU / MPS).
DEVICE_SHARE = 0.25
HOST_BUDGET_BYTES = 4 << 30


def sequential_batches(n: int, batch_size: int) -> list[torch.Tensor]:
    """Index batches covering ``0..n-1`` in order (for evaluation)."""
    return [torch.arange(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]


@dataclass
class TwoLabels:
    """Targets of a two-object image (MultiMNIST, Sabour et al.): both classes and, when
    the file stores them, each object's own image for its reconstruction."""

    first: torch.Tensor
    second: torch.Tensor
    image_a: torch.Tensor | None = None
    image_b: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.first)


class DeviceSplit:
    """A split held on the device as uint8; batches are sliced there.

    With ``second`` labels (a two-object set such as MultiMNIST) batches carry
    :class:`TwoLabels` targets, with each object's source image
    when ``sources`` (uint8 [N, 2, C, H, W]) is given.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, device: torch.device,
                 second: np.ndarray | None = None, sources: np.ndarray | None = None
                 ) -> None:
        self.images = torch.from_numpy(np.ascontiguousarray(images)).to(device)
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(device)
        self.device = device
        self.second = (torch.from_numpy(np.asarray(second, dtype=np.int64)).to(device)
                       if second is not None else None)
        self.sources = (torch.from_numpy(np.ascontiguousarray(sources)).to(device)
                        if sources is not None else None)

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, index_batches: Iterable[torch.Tensor]
                ) -> Iterator[tuple[torch.Tensor, Any]]:
        for index in index_batches:
            if self.device.type == "cuda":  # pinned: the copy does not wait for the GPU
                index = index.pin_memory()
            index = index.to(self.device, non_blocking=True)
            x, y = self.images[index].float().div_(255.0), self.labels[index]
            if self.second is None:
                yield x, y
                continue
            pair = (self.sources[index].float().div_(255.0) if self.sources is not None
                    else None)
            yield x, TwoLabels(y, self.second[index], *(pair.unbind(1) if pair is not None
                                                        else (None, None)))


class _H5Batches(torch.utils.data.Dataset):
    """Reads whole batches from one split; each worker process opens its own handle."""

    def __init__(self, path: Path, split: str, rows: np.ndarray) -> None:
        self.path, self.split, self.rows = Path(path), split, rows
        self._file: h5py.File | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._file is None:  # opened lazily, so in the worker, never inherited
            self._file = h5py.File(self.path, "r")
        rows = self.rows[index.numpy()]
        # h5py fancy indexing wants increasing unique rows; batches may repeat samples
        unique, inverse = np.unique(rows, return_inverse=True)
        grp = self._file[self.split]
        try:
            images = grp["images"][unique][inverse]
            labels = grp["labels"][unique][inverse]
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise CapsmedError(f"{self.path}: cannot read ({first_line(exc)}); the file is "
                               "damaged or truncated: write it again") from exc
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


class StreamingSplit:
    """A split (or a subset of its rows) read from HDF5 batch by batch.

    Args:
        path: Dataset file.
        split: Split name in the file.
        rows: Rows of the split to use, in the order sampler indices refer to.
        labels: Labels of those rows (the samplers need them up front).
        device: Where batches go.
        workers: Reader processes (0 reads in the training process).
    """

    def __init__(self, path: Path, split: str, rows: np.ndarray, labels: np.ndarray,
                 device: torch.device, workers: int = 2) -> None:
        self.dataset = _H5Batches(path, split, np.asarray(rows, dtype=np.int64))
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        self.device, self.workers = device, workers

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, index_batches: Iterable[torch.Tensor]
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # Its own generator: a DataLoader otherwise draws its workers' base seed from
        # torch's global one, which shifts every later dropout mask, so a resumed epoch
        # (a new loader) would not repeat the uninterrupted one.
        loader = torch.utils.data.DataLoader(
            self.dataset, sampler=list(index_batches), batch_size=None,
            num_workers=self.workers, pin_memory=self.device.type == "cuda",
            persistent_workers=False, prefetch_factor=4 if self.workers else None,
            generator=torch.Generator(), worker_init_fn=_reader_ignores_sigterm)
        batches = iter(loader)
        while True:
            try:
                images, labels = next(batches)
            except StopIteration:
                return
            except CapsmedError as exc:  # from a reader process: its traceback is folded
                raise CapsmedError(_worker_message(str(exc))) from None
            yield (images.to(self.device, non_blocking=True).float().div_(255.0),
                   labels.to(self.device, non_blocking=True))


def _reader_ignores_sigterm(_worker_id: int) -> None:
    """Leave SIGTERM to the training process, which saves its state and stops (then the
    DataLoader ends its readers). Sent to the whole process group (Slurm preemption,
    ``kill -TERM -PGID``) it reached the readers too, whose torch handler ends them on
    any sender's SIGTERM but the parent's: the run failed with a DataLoader worker
    error instead, its progress since the last saved state lost."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _worker_message(text: str) -> str:
    """The original message of an error a DataLoader worker raised (torch wraps it in
    'Caught ... in DataLoader worker process N' and the worker's traceback)."""
    last = text.strip().splitlines()[-1] if text.strip() else text
    return last.split("CapsmedError: ", 1)[-1]


def should_stream(loading: str, nbytes: int, device: torch.device) -> bool:
    """Decide between :class:`DeviceSplit` and :class:`StreamingSplit` for ``nbytes``."""
    if loading not in LOADINGS:
        raise CapsmedError(f"data_loading must be one of {', '.join(LOADINGS)}, got "
                           f"'{loading}'")
    if loading != "auto":
        return loading == "stream"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return nbytes > DEVICE_SHARE * free
    return nbytes > HOST_BUDGET_BYTES


def split_nbytes(path: Path, split: str, rows: int) -> int:
    """Bytes ``rows`` images of ``split`` take as uint8."""
    with h5py.File(path, "r") as f:
        shape = f[split]["images"].shape
    return int(rows * np.prod(shape[1:]))
