"""The settings of the analyses (``capsmed analyze ...``), one frozen dataclass each,
standard library only: the command line reads their defaults for its help texts
without importing torch. Each analysis module re-exports its config."""

from __future__ import annotations

from dataclasses import dataclass

from capsmed.errors import CapsmedError

PADDINGS = ("zeros", "border", "reflection")
# paper 004 s3.3's latent factors, and the names that stand for several
FACTORS = ("rotation", "translation-x", "translation-y", "scale", "shear-x", "shear-y")
ALIASES = {"translation": ("translation-x", "translation-y"),
           "shear": ("shear-x", "shear-y"), "all": FACTORS}


@dataclass(frozen=True)
class AffineConfig:
    """Settings of the affine robustness analysis (all recorded in ``affine.json``).

    Attributes:
        rotation: Maximum rotation in degrees (affNIST: 20).
        shear: Maximum shear angle in degrees (affNIST: 45; factor tan(angle)).
        scale: Range of the per-axis scale factors (affNIST: 0.8-1.2).
        translation: Maximum shift per axis in px on a 40x40 canvas (affNIST: 8);
            scaled with the image side.
        keep_inside: Narrow the shift so that the content stays on the canvas (affNIST).
        padding: ``zeros``, ``border`` or ``reflection`` for pixels from outside.
        repeats: Random transforms per test image (the accuracy is their mean).
        sweep_step: Degrees between rotation-sweep angles.
        seed: Seed of the transform parameters (and of ``max_samples``).
        batch_size: Images per forward pass.
        max_samples: Analyse a seeded random subset of this size (None: all).
        split: Split of the dataset to test on.
    """

    rotation: float = 20.0
    shear: float = 45.0
    scale: tuple[float, float] = (0.8, 1.2)
    translation: float = 8.0
    keep_inside: bool = True
    padding: str = "zeros"
    repeats: int = 1
    sweep_step: float = 15.0
    seed: int = 0
    batch_size: int = 256
    max_samples: int | None = None
    split: str = "test"

    def __post_init__(self) -> None:
        if self.padding not in PADDINGS:
            raise CapsmedError(f"padding must be one of {', '.join(PADDINGS)}, got "
                               f"'{self.padding}'")
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise CapsmedError(f"scale range must satisfy 0 < low <= high, got {lo}-{hi}")
        if not 0 <= self.shear < 90 or self.rotation < 0 or self.translation < 0:
            raise CapsmedError("rotation >= 0, 0 <= shear < 90 degrees and translation >= 0")
        if self.repeats < 1 or self.batch_size < 1:
            raise CapsmedError("repeats and batch size must be >= 1")
        if not 0 < self.sweep_step <= 180:
            raise CapsmedError(f"sweep step must be within (0, 180] degrees, got "
                               f"{self.sweep_step}")
        if self.max_samples is not None and self.max_samples < 1:
            raise CapsmedError(f"max samples must be >= 1, got {self.max_samples}")
        _check_seed(self.seed)


@dataclass(frozen=True)
class CompactnessConfig:
    """Settings of the compactness analysis (recorded in ``compactness.json``).

    Attributes:
        factors: Factors to score (names of :data:`FACTORS`).
        steps: Images per list (values of the factor).
        rotation, translation, scale, shear: Ranges (degrees; px on 40x40; factor
            range; degrees).
        padding: ``zeros``, ``border`` or ``reflection``.
        batch_size: Source images per forward pass (each makes ``steps`` inputs).
        max_samples: Score a seeded random subset of this size (None: all).
        seed: Seed of that subset.
        split: Split to score.
    """

    factors: tuple[str, ...] = FACTORS
    steps: int = 11
    rotation: float = 20.0
    translation: float = 8.0
    scale: tuple[float, float] = (0.8, 1.2)
    shear: float = 45.0
    padding: str = "zeros"
    batch_size: int = 64
    max_samples: int | None = None
    seed: int = 0
    split: str = "test"

    def __post_init__(self) -> None:
        unknown = [f for f in self.factors if f not in FACTORS]
        if unknown or not self.factors:
            raise CapsmedError(f"unknown factor(s) {', '.join(unknown) or '(none given)'} "
                               f"(choose from: {', '.join([*FACTORS, *ALIASES])})")
        if self.steps < 2:
            raise CapsmedError(f"steps must be >= 2 (a variance needs two images), got "
                               f"{self.steps}")
        if self.padding not in PADDINGS:
            raise CapsmedError(f"padding must be one of {', '.join(PADDINGS)}")
        if not 0 < self.scale[0] <= self.scale[1] or not 0 <= self.shear < 90:
            raise CapsmedError("scale range must be positive and shear within [0, 90)")
        if self.batch_size < 1 or (self.max_samples is not None and self.max_samples < 1):
            raise CapsmedError("batch size and max samples must be >= 1")
        _check_seed(self.seed)


def _check_seed(seed: int) -> None:
    """A negative seed failed in NumPy's generator with a traceback, after the model and
    the data were loaded."""
    if seed < 0:
        raise CapsmedError(f"seed must be >= 0, got {seed}")


def expand_factors(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Factor names with the aliases ``translation``, ``shear`` and ``all`` expanded."""
    out: list[str] = []
    for name in names:
        for f in ALIASES.get(name, (name,)):
            if f not in out:
                out.append(f)
    return tuple(out)


@dataclass(frozen=True)
class ManifoldConfig:
    """Settings of the manifold analysis (recorded in ``manifold.json``).

    Attributes:
        pairs: (fixed, moving) digit pairs, one 2-D grid each.
        radius: Offsets from -radius to +radius units per axis (paper: 4, a 9x9 grid).
        step: Pixels per unit.
        perplexity: t-SNE perplexity (None: min(30, (n - 1) / 3)).
        layer: Module whose output is embedded (None: see the module docstring).
        centre: Centre both digits by their centre of mass first.
        seed: Seed of the digit choice and of t-SNE.
        split: Split the digits come from.
        batch_size: Images per forward pass.
    """

    pairs: int = 5
    radius: int = 4
    step: int = 1
    perplexity: float | None = None
    layer: str | None = None
    centre: bool = True
    seed: int = 0
    split: str = "test"
    batch_size: int = 256

    def __post_init__(self) -> None:
        if self.pairs < 1 or self.radius < 1 or self.step < 1 or self.batch_size < 1:
            raise CapsmedError("pairs, radius, step and batch size must be >= 1")
        if self.perplexity is not None and not self.perplexity > 0:  # NaN: sklearn's error
            raise CapsmedError(f"perplexity must be > 0, got {self.perplexity}")
        _check_seed(self.seed)
