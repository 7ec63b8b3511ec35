"""Training runs: :func:`train` a new one, :func:`resume` an interrupted one.

The set-up is :class:`capsmed.train.run.Run`; the epochs are
:func:`capsmed.train.loop.run_loop`.

A run directory describes itself: ``config.yaml`` (resolved options, model arguments,
environment), ``train_indices.npy`` (+ ``test_indices.npy`` for a cross-validation
fold), ``metrics.jsonl``, the checkpoint at minimum validation loss, ``resume.pt``
while the run is unfinished, ``summary.json`` and ``curves.png`` at the end.
"""

from __future__ import annotations

import logging
from pathlib import Path

from capsmed.data.contract import read_info, warn_if_older_revision
from capsmed.device import select_device
from capsmed.errors import CapsmedError
from capsmed.train import distributed
from capsmed.train.config import TrainConfig
from capsmed.train.handlers import check_handlers
from capsmed.train.loop import run_loop
from capsmed.train.protocol import PROTOCOL_REVISION
from capsmed.train.run import Run
from capsmed.train.run_checks import warn_unused_recon_weight
from capsmed.train.run_config import CONFIG, check_dataset_unchanged, read_run_config
from capsmed.train.state import check_options_unchanged, load_state

log = logging.getLogger(__name__)


def train(config: TrainConfig, disable_progress: bool | None = None,
          stop_after_steps: int | None = None) -> Path:
    """Train ``config.arch`` on ``config.data``; return the run directory.

    Args:
        config: The run's options.
        disable_progress: Hide progress bars.
        stop_after_steps: Stop (resumably, as on Ctrl-C) after this many steps.

    Raises:
        TrainingInterrupted: when stopped by Ctrl-C / SIGTERM / ``stop_after_steps``;
            the state is saved and ``capsmed train --resume RUN_DIR`` continues it.
    """
    info = read_info(Path(config.data))
    cfg = config.resolved(info.image_domain())
    check_handlers(cfg)  # e.g. a missing package: refused before anything is written
    ctx, dev = distributed.setup(cfg.device)
    try:
        run = Run(cfg, info, ctx, select_device(dev), None, None, disable_progress)
        try:
            if ctx.is_main:
                warn_unused_recon_weight(config, run.model)  # as given, not the domain's
                warn_if_older_revision(info, "training on")
            return run_loop(run, None, stop_after_steps)
        finally:
            run.release()
    finally:
        distributed.teardown(ctx)


def resume(run_dir: Path, disable_progress: bool | None = None,
           stop_after_steps: int | None = None) -> Path:
    """Continue an interrupted run from its ``resume.pt`` to the same result.

    Raises:
        CapsmedError: if the run has no resumable state, its dataset file changed or
            its config.yaml's options were edited.
    """
    run_dir = Path(run_dir)
    saved = read_run_config(run_dir)
    config_path = run_dir / CONFIG
    state = load_state(run_dir)
    revision = (saved.get("environment") or {}).get("protocol_revision", 0)
    if revision != PROTOCOL_REVISION:
        raise CapsmedError(f"{config_path}: the run was started by a capsmed of protocol "
                           f"revision {revision}; this one is revision {PROTOCOL_REVISION} "
                           "and computes such a run differently (capsmed/train/protocol.py)"
                           "; train a new run")
    cfg = TrainConfig.from_dict(saved["train"], origin=str(config_path))
    info = read_info(Path(cfg.data))
    check_dataset_unchanged(saved, run_dir, info.path)
    if saved["dataset"].get("created") not in (None, info.created):
        raise CapsmedError(f"{info.path}: the dataset file was rewritten since this run "
                           f"started ({saved['dataset']['created']} -> {info.created}); "
                           "start a new run")
    check_handlers(cfg)
    ctx, dev = distributed.setup(cfg.device)
    try:
        run = Run(cfg, info, ctx, select_device(dev), run_dir, saved["model_kwargs"],
                  disable_progress)
        try:
            check_options_unchanged(state, run.options, config_path)
            log.info("resuming %s at epoch %d, step %d", run_dir,
                     state["progress"]["epoch"], state["progress"]["step"])
            return run_loop(run, state, stop_after_steps)
        finally:
            run.release()
    finally:
        distributed.teardown(ctx)
