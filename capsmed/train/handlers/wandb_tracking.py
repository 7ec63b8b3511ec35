"""Weights & Biases logging (``capsmed train --wandb PROJECT``): one W&B run per capsmed
run, online or, with ``WANDB_MODE=offline``, in local files that ``wandb sync`` uploads
later.

The W&B run is named after the run folder; its config holds the run's options and
model arguments (:func:`~capsmed.train.handlers.run_params.run_params`, the names of
MLflow's params) and, under ``capsmed.*``, the dataset's name, digest and domain and
capsmed's version; each epoch's record is logged with the epoch as step; at the end the
summary gets the kept epoch and its selection loss, and ``summary.json``,
``curves.png`` and ``metrics.jsonl`` are saved with the run. ``RUN_DIR/wandb.json``
records the project and run id, so that ``--resume`` continues the same W&B run.
W&B's own local files go where W&B puts them (``WANDB_DIR``, else ``./wandb``).
Rank 0 only; W&B does not capture the terminal (``console="off"``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from capsmed import __version__
from capsmed.errors import CapsmedError, first_line, shell_quoted
from capsmed.io import write_text_atomic
from capsmed.train.handlers.base import LoopHandler, LoopState
from capsmed.train.handlers.run_params import run_params
from capsmed.train.run_config import METRICS, SUMMARY

if TYPE_CHECKING:
    from capsmed.train.config import TrainConfig
    from capsmed.train.run import Run

log = logging.getLogger(__name__)

WANDB_FILE = "wandb.json"  # where RUN_DIR is logged: W&B project and run id
INSTALL = "pip install 'capsmed[wandb]'"


class WandbTracking(LoopHandler):
    """One W&B run per capsmed run (``--wandb``). Rank 0 only."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.wandb_run: Any = None  # None once logging stopped after a failure
        self.ended = False

    @classmethod
    def create(cls, run: Run) -> WandbTracking | None:
        return cls(run) if run.cfg.wandb and run.ctx.is_main else None

    @staticmethod
    def check(cfg: TrainConfig) -> None:
        if not cfg.wandb:
            return
        try:
            import wandb  # noqa: F401 -- the run imports it next anyway
        except ImportError:
            raise CapsmedError(f"--wandb needs the wandb package: {INSTALL}") from None

    def on_start(self, loop: LoopState) -> None:
        """Start the W&B run (a resumed run: continue its own). A failure here (no API
        key, no server) stops the run before any step; ``--resume`` starts it again."""
        import wandb

        run, path = self.run, self.run.run_dir / WANDB_FILE
        saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        try:
            self.wandb_run = wandb.init(
                project=run.cfg.wandb, name=run.run_dir.name,
                id=saved["run_id"] if saved else None, resume="allow" if saved else None,
                config=None if saved else {**run_params(run), **self._identity()},
                settings=wandb.Settings(console="off"))
        except Exception as exc:  # W&B raises its own kinds, and OSError's
            raise CapsmedError(f"{run.run_dir}: cannot start its W&B run in project "
                               f"'{run.cfg.wandb}' ({first_line(exc)}); continue with: "
                               f"capsmed train --resume {shell_quoted(run.run_dir)}") from None
        if not saved:
            write_text_atomic(path, json.dumps({"project": run.cfg.wandb,
                                                "run_id": self.wandb_run.id}, indent=2))
        log.info("W&B: run %s in project '%s'%s", self.wandb_run.id, run.cfg.wandb,
                 " (continued)" if saved else "")
        # a run killed after its last saved state had logged later epochs: W&B drops a
        # step below the run's current one, so it keeps that attempt's values there
        after = getattr(self.wandb_run, "starting_step", 0) or 0
        if saved and after > loop.progress.epoch:
            log.warning("W&B: run %s already holds epochs %d-%d, logged by an attempt "
                        "lost after the last saved state; W&B ignores steps logged again, "
                        "so it keeps that attempt's values there (%s holds the resumed "
                        "run's)", self.wandb_run.id, loop.progress.epoch, after - 1,
                        run.run_dir / METRICS)

    def _identity(self) -> dict[str, str]:
        info = self.run.info
        return {"capsmed.version": __version__, "capsmed.dataset": info.dataset,
                "capsmed.dataset_digest": self.run.data_digest,
                "capsmed.domain": info.image_domain().name}

    def on_epoch_end(self, loop: LoopState) -> None:
        record = loop.record
        numbers = {k: v for k, v in record.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        self._safely(f"log epoch {record['epoch']}",
                     lambda: self.wandb_run.log(numbers, step=record["epoch"]))

    def on_stop(self, loop: LoopState) -> None:
        self._finish(exit_code=130)  # stopped on request; --resume continues the run

    def on_end(self, loop: LoopState) -> None:
        p, run_dir = loop.progress, self.run.run_dir

        def summarise() -> None:
            self.wandb_run.summary.update({"best_epoch": p.best_epoch,
                                           "best_selection_loss": p.best})
            for name in (SUMMARY, "curves.png", METRICS):
                if (run_dir / name).is_file():
                    self.wandb_run.save(str(run_dir / name), base_path=str(run_dir),
                                        policy="now")

        self._safely("save the summary and files", summarise)
        self._finish(exit_code=0)

    def close(self) -> None:
        if not self.ended:  # the loop ended by an error
            self._finish(exit_code=1)

    def _finish(self, exit_code: int) -> None:
        self.ended = True
        self._safely("finish the run", lambda: self.wandb_run.finish(exit_code=exit_code))

    def _safely(self, what: str, call: Any) -> None:
        """Make ``call``; on a failure, warn once and stop logging the run."""
        if self.wandb_run is None:
            return
        try:
            call()
        except Exception as exc:
            log.warning("W&B: could not %s (%s); logging stops here, training goes on "
                        "(every epoch is in %s)", what, first_line(exc),
                        self.run.run_dir / METRICS)
            self.wandb_run = None
