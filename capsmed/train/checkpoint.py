"""Writing a checkpoint: safetensors weights + a JSON of the architecture and its
arguments. Reading one back (checked against the run's other files) is
:mod:`capsmed.runs.checkpoint`'s job: only that layer reads ``checkpoint.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

from capsmed.data.digest import file_digest
from capsmed.io import atomic_path, write_failure, writing
from capsmed.train.run_config import META, WEIGHTS


def save_checkpoint(run_dir: Path, model: nn.Module, meta: dict[str, Any]) -> None:
    """Write weights and metadata atomically (metadata last: it marks a complete pair).

    Both are written in full before either is renamed into place, so a failed write
    (a full disk) leaves the previous pair as it was.
    """
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    weights, meta_path = Path(run_dir) / WEIGHTS, Path(run_dir) / META
    # the inner block renames first: the weights, then the metadata
    with atomic_path(meta_path) as meta_tmp, atomic_path(weights) as weights_tmp:
        try:
            save_file(state, str(weights_tmp))
        except Exception as exc:  # safetensors' own error types, or OSError
            raise write_failure(weights, exc) from None
        # the pair belongs together: a weights file from elsewhere is caught on loading
        meta = {**meta, "weights_digest": file_digest(weights_tmp)}
        with writing(meta_path):
            meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True),
                                encoding="utf-8")
