"""The values a training option may take, standard library only: ``capsmed train``
builds its options and their help from :class:`capsmed.train.config.TrainConfig`
without importing torch (``capsmed --help`` stays fast)."""

from __future__ import annotations

SAMPLERS = ("shuffle", "balanced")  # capsmed.train.sampling
OPTIMIZERS = ("adam", "nadam")  # capsmed.train.optim
SCHEDULES = ("constant", "exponential")
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")  # capsmed.train.step
# Model arguments set by the trainer from the dataset, not by the user.
FROM_DATA = frozenset({"in_channels", "num_classes", "input_size", "input_mean",
                       "input_std"})
