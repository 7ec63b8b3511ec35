"""A run's options as the flat ``name -> value`` table experiment trackers compare runs
by (MLflow params, TensorBoard hparams): one function, so both show the same names."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capsmed.train.run import Run

Scalar = str | int | float | bool


def run_params(run: Run) -> dict[str, Scalar]:
    """The run's resolved options (``train`` in its ``config.yaml``) and its model's
    arguments as ``model.<name>``, each a number, a bool or text.

    Lists, mappings and unset options are written as JSON text (``[3, 4]``, ``{}``,
    ``null``): a tracker cannot hold them otherwise, and an unset option stays
    distinguishable from the text ``"None"``. The model's arguments are the resolved
    ones (image size, classes, the training split's channel statistics and the user's
    ``--model-arg``), so ``model_kwargs`` of the options is not repeated.
    """
    options = {k: v for k, v in run.cfg.to_dict().items() if k != "model_kwargs"}
    options["data"] = str(run.info.path.resolve())
    options["out"] = str(run.run_dir)
    model = {f"model.{k}": v for k, v in sorted(run.model_kwargs.items())}
    return {k: scalar(v) for k, v in {**options, **model}.items()}


def scalar(value: object) -> Scalar:
    """``value`` as it is when a tracker can hold it, else as JSON text."""
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, default=str)
