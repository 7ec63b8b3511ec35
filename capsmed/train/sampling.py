"""Which training samples each step sees: shuffled passes or class-balanced batches."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import torch

from capsmed.errors import CapsmedError
from capsmed.train.choices import SAMPLERS

log = logging.getLogger(__name__)



class BatchSampler:
    """Index batches for one epoch, drawn with a seeded CPU generator.

    Args:
        labels: [N] class of each training sample.
        batch_size: Samples per batch (balanced: ``batch_size // K`` per class; a
            batch below K classes is refused).
        mode: ``shuffle``: passes over a fresh permutation. ``balanced`` (paper 001):
            every batch holds the same number of samples of each class, drawn at random
            within the class and shuffled in the batch.
        steps: Batches per epoch; None is one pass over the data (the last batch
            partial). A fixed count cycles through as many permutations as needed, so
            a subset trains for as many iterations as the full set (paper 000 s3.1).
        generator: Seeded torch generator (CPU).
    """

    def __init__(self, labels: torch.Tensor, batch_size: int, mode: str, steps: int | None,
                 generator: torch.Generator) -> None:
        if mode not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {mode!r}")
        self.labels = labels.cpu()
        self.batch_size, self.mode, self.generator = batch_size, mode, generator
        self.classes = [torch.nonzero(self.labels == c).flatten()
                        for c in torch.unique(self.labels)]
        k = max(1, len(self.classes))
        if mode == "balanced" and batch_size < k:
            raise CapsmedError(f"--sampler balanced puts every class in each batch: "
                               f"--batch-size {batch_size} is below the {k} classes of the "
                               f"training rows (use {k} or a multiple)")
        if mode == "balanced" and batch_size % k:
            log.warning("--sampler balanced: batches hold %d images (%d of each of %d "
                        "classes), not --batch-size %d", batch_size // k * k, batch_size // k,
                        k, batch_size)
        self.per_class = max(1, batch_size // k)
        per_batch = self.per_class * len(self.classes) if mode == "balanced" else batch_size
        self.steps = steps if steps is not None else math.ceil(len(self.labels) / per_batch)
        self.one_pass = steps is None and mode == "shuffle"

    def __len__(self) -> int:
        return self.steps

    def batch_sizes(self) -> set[int]:
        """The sizes of the batches an epoch yields: one pass's last batch holds the
        rest of the samples; other passes and balanced batches are always whole."""
        if self.mode == "balanced":
            return {self.per_class * len(self.classes)}
        n, b = len(self.labels), self.batch_size
        if self.one_pass:
            return {min(n, b), *([n % b] if n > b and n % b else [])}
        return {b}

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.mode == "balanced":
            for _ in range(self.steps):
                picks = [members[torch.randint(len(members), (self.per_class,),
                                               generator=self.generator)]
                         for members in self.classes]
                batch = torch.cat(picks)
                yield batch[torch.randperm(len(batch), generator=self.generator)]
            return
        n, b = len(self.labels), self.batch_size
        if self.one_pass:
            order = torch.randperm(n, generator=self.generator)
        else:
            passes = math.ceil(self.steps * b / n)
            order = torch.cat([torch.randperm(n, generator=self.generator)
                               for _ in range(passes)])
        for step in range(self.steps):
            yield order[step * b:(step + 1) * b]
