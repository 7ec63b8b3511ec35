"""capsmed: capsule networks vs ConvNets for medical image classification.

The library's face is :mod:`capsmed.api` (``capsmed.preprocess``, ``train_run``,
``evaluate_run``, ``load_run``, ``predict_array``, ``predict_inputs``,
``export_run``), imported on first use so that ``import capsmed`` (and ``capsmed
--help``) stays fast.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("capsmed")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"

__all__ = ["__version__", "evaluate_run", "export_run", "load_run", "predict_array",
           "predict_inputs", "preprocess", "train_run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from capsmed import api

        return getattr(api, name)
    raise AttributeError(f"module 'capsmed' has no attribute {name!r}")
