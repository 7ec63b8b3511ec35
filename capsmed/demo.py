"""The end-to-end demo behind ``make demo``: synth -> preprocess -> train -> evaluate
-> predict.

It runs the real pipeline on synthetic TUPAC16 data in the official layout, trains
the paper's CapsNet and LeNet briefly, reports both on the held-out cases, and applies
the CapsNet to two new images (heatmaps and QuPath GeoJSON).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from capsmed.errors import CapsmedError
from capsmed.evaluate.evaluation import Evaluation, evaluate_run
from capsmed.predict.config import PredictOptions
from capsmed.predict.engine import predict

log = logging.getLogger(__name__)

MARKER = ".capsmed-demo"


@dataclass(frozen=True)
class DemoRun:
    """One architecture the demo trains, at its paper size."""

    arch: str
    epochs: int


# The paper's 8.2M-parameter CapsNet trains at ~75-150 images/s on 2 CPU cores, so
# 8 epochs of ~1,600 patches take 1.5-3 minutes; LeNet is ~100x faster.
DEMO_RUNS = (DemoRun("capsnet", 8), DemoRun("lenet", 20))


@dataclass(frozen=True)
class DemoConfig:
    """Sizes chosen to finish in a few minutes on 2 CPU cores.

    Attributes:
        workdir: Folder for raw data, the .h5 file and the runs (owned by the demo).
        cases, images_per_case, size: Synthetic TUPAC16 set; the held-out test split
            is whole cases, as in the real protocol.
        positives_per_mitosis: Jittered copies per mitosis (paper scale: ~20).
        runs: Architectures to train, at paper size. Learning rate and reconstruction
            weight are the paper 000 defaults for a medical set (1e-4, 5e-5); inputs are
            standardised with the training split's statistics.
    """

    workdir: Path = Path("demo_out")
    cases: int = 14
    images_per_case: int = 3
    size: int = 512
    positives_per_mitosis: int = 8
    seed: int = 0
    runs: tuple[DemoRun, ...] = DEMO_RUNS
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.cases < 3:  # whole cases per split
            raise CapsmedError(f"--cases must be >= 3 (one case each for training, "
                               f"validation and test), got {self.cases}")
        if self.seed < 0:
            raise CapsmedError(f"--seed must be >= 0, got {self.seed}")


def _claim_workdir(workdir: Path) -> None:
    """Create ``workdir`` or reuse one an earlier demo made; never clobber anything else."""
    if workdir.exists() and not workdir.is_dir():
        raise CapsmedError(f"{workdir}: is a file; choose a folder as --workdir")
    if workdir.exists() and any(workdir.iterdir()) and not (workdir / MARKER).exists():
        raise CapsmedError(f"{workdir}: exists and was not made by capsmed demo; "
                           "choose another --workdir")
    for stale in ("raw", "tupac16.h5", "runs", "new", "predictions"):
        target = workdir / stale
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("created by capsmed demo; safe to delete\n")


def run_demo(cfg: DemoConfig = DemoConfig()) -> list[tuple[DemoRun, Evaluation]]:
    """Run the whole pipeline; returns each trained run with its test-set evaluation
    (the first run's predictions on new images are in ``workdir/predictions``)."""
    from capsmed.data.sources.tupac16.reader import Tupac16Config, preprocess_tupac16
    from capsmed.data.sources.tupac16.synth import write_tupac16
    from capsmed.train.config import TrainConfig
    from capsmed.train.engine import train

    workdir = Path(cfg.workdir)
    _claim_workdir(workdir)
    log.info("1/5 synthesising %d TUPAC16 cases in the official layout", cfg.cases)
    raw = write_tupac16(workdir / "raw", cases=cfg.cases, images_per_case=cfg.images_per_case,
                        size=cfg.size, seed=cfg.seed).root
    log.info("2/5 preprocessing (hematoxylin channel, 100x100 patches -> 28x28)")
    data = preprocess_tupac16(raw, workdir / "tupac16.h5", Tupac16Config(
        positives_per_mitosis=cfg.positives_per_mitosis, seed=cfg.seed))
    evaluations = []
    for run in cfg.runs:
        log.info("3/5 training %s for %d epochs", run.arch, run.epochs)
        run_dir = train(TrainConfig(data=str(data), arch=run.arch, epochs=run.epochs,
                                    batch_size=cfg.batch_size, seed=cfg.seed,
                                    out=str(workdir / "runs" / run.arch)))
        evaluations.append((run, evaluate_run(run_dir, split="test")))
    log.info("4/5 evaluated on the held-out test cases")
    new = write_tupac16(workdir / "new", cases=1, images_per_case=2, size=cfg.size,
                        seed=cfg.seed + 1000).root
    log.info("5/5 predicting with %s on 2 new images", cfg.runs[0].arch)
    predict(workdir / "runs" / cfg.runs[0].arch, [new], workdir / "predictions",
            PredictOptions())
    return evaluations
