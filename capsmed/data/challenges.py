"""Paper 000's data challenges: which training samples a run may use.

* ``fraction``: a seeded subset of the training split keeping the class ratios
  (paper 000 section 3.1: 50%, 10%, 5%, 1%);
* ``imbalance``: named classes reduced to a percentage of their samples (section 3.2:
  one class, or two, cut to 20%).

* ``per_class_limit``: at most X samples of each class (paper 001's small-data
  study); with cross-validation folds, see :func:`cv_partition`.

They compose (limit, then imbalance, then fraction) and act on indices only, so the
subset is recorded in the run directory and the dataset file is never rewritten.

Cross-validation (paper 001): a file written with folds (split ``all`` + ``folds``)
trains on every fold but one and tests on that one (:func:`cv_partition`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataChallenge:
    """A data challenge: the subset of the training split a run may use.

    Attributes:
        fraction: Share of the training split to keep, per class (0 < f <= 1).
        imbalance: ``{class name: percent kept}`` for the classes to reduce.
    """

    fraction: float | None = None
    imbalance: dict[str, float] = field(default_factory=dict)
    per_class_limit: int | None = None

    def __post_init__(self) -> None:
        if self.per_class_limit is not None and self.per_class_limit < 1:
            raise CapsmedError(f"--per-class-limit must be >= 1, got {self.per_class_limit}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise CapsmedError(f"--fraction must be within (0, 1], got {self.fraction}")
        for name, pct in self.imbalance.items():
            if not 0.0 < pct <= 100.0:
                raise CapsmedError(f"--imbalance {name}={pct}: the percentage kept must be "
                                   "within (0, 100]")

    @property
    def is_full(self) -> bool:
        return (self.fraction in (None, 1.0) and not self.imbalance
                and self.per_class_limit is None)


def parse_imbalance(text: str | None) -> dict[str, float]:
    """``"mitosis=20,non-mitosis=50"`` -> ``{"mitosis": 20.0, "non-mitosis": 50.0}``."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, pct = item.rpartition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            if name.strip() in out:
                raise CapsmedError(f"--imbalance names class '{name.strip()}' twice")
            out[name.strip()] = float(pct)
        except ValueError:
            raise CapsmedError(f"--imbalance expects CLASS=PERCENT[,CLASS=PERCENT], got "
                               f"'{item}'") from None
    return out


def _keep_per_class(labels: np.ndarray, keep: Mapping[int, float],
                    rng: np.random.Generator) -> np.ndarray:
    """Indices keeping ``keep[c]`` (a share) of each class c; at least one sample each."""
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        share = keep.get(int(c), 1.0)
        count = len(members) if share >= 1.0 else max(1, round(share * len(members)))
        chosen.append(rng.choice(members, size=count, replace=False) if count < len(members)
                      else members)
    return np.sort(np.concatenate(chosen)) if chosen else np.empty(0, dtype=np.int64)


def select_training_indices(labels: np.ndarray, class_names: Sequence[str],
                            challenge: DataChallenge, seed: int) -> np.ndarray:
    """Indices of the training samples a run uses under ``challenge`` (sorted, seeded).

    Raises:
        CapsmedError: if ``imbalance`` names a class the dataset does not have.
    """
    labels = np.asarray(labels)
    index = np.arange(len(labels))
    if challenge.per_class_limit is not None:
        index = limit_per_class(labels, challenge.per_class_limit, seed)
    rng = np.random.default_rng([seed, 2018])  # its own stream: training seeds differ
    if challenge.imbalance:
        from capsmed.data.schema import class_index  # h5py: not when the CLI starts

        found = {n: class_index(class_names, n) for n in challenge.imbalance}
        unknown = sorted(n for n, i in found.items() if i is None)
        if unknown:
            raise CapsmedError(f"--imbalance: unknown class(es) {', '.join(unknown)} "
                               f"(the dataset has: {', '.join(class_names)})")
        twice = [n for n, i in found.items() if list(found.values()).count(i) > 1]
        if twice:  # the same name in NFC and in NFD: which percentage would be meant?
            raise CapsmedError(f"--imbalance names class '{class_names[found[twice[0]]]}' "
                               f"twice (as {', '.join(map(repr, twice))})")
        keep = {found[n]: p / 100.0 for n, p in challenge.imbalance.items()}
        index = index[_keep_per_class(labels[index], keep, rng)]
    if challenge.fraction is not None and challenge.fraction < 1.0:
        keep = {int(c): challenge.fraction for c in np.unique(labels[index])}
        index = index[_keep_per_class(labels[index], keep, rng)]
    return index


def limit_per_class(labels: np.ndarray, limit: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``limit`` samples per class, chosen with ``seed``."""
    rng = np.random.default_rng([seed, 2021])
    chosen = [members if len(members) <= limit else rng.choice(members, limit, replace=False)
              for members in (np.flatnonzero(labels == c) for c in np.unique(labels))]
    return np.sort(np.concatenate(chosen)) if chosen else np.empty(0, dtype=np.int64)


def warn_classes_under_limit(labels: np.ndarray, class_names: Sequence[str], limit: int
                             ) -> list[str]:
    """Warn, naming them, about the classes with fewer than ``limit`` samples: "at most
    X per class" keeps all of theirs, so the run has fewer than X of them (and with no
    class above X the limit keeps every sample). Returns ``["name (count)", ...]``."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(class_names))
    short = [f"{name} ({n})" for name, n in zip(class_names, counts.tolist(), strict=True)
             if 0 < n < limit]
    if short:
        inert = ("; no class has more, so the limit keeps every sample"
                 if not (counts > limit).any() else "")
        log.warning("--per-class-limit %d: %d class(es) have fewer samples and keep all of "
                    "them: %s%s", limit, len(short), ", ".join(short), inert)
    return short


def limit_per_class_over_folds(labels: np.ndarray, folds: np.ndarray, limit: int,
                               seed: int) -> np.ndarray:
    """Sorted indices of at most ``limit`` samples per class, spread evenly over the
    folds: paper 001 used "up to x images per class ... to create 5 folds", so each fold
    holds about x / k of every class (as many as it has, the shortfall taken from the
    other folds). Drawn at random without regard to the folds, x = 10 gave one class 5
    training images and another 10."""
    rng = np.random.default_rng([seed, 2021])
    k = int(folds.max()) + 1 if len(folds) else 0
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) <= limit:
            chosen.append(members)
            continue
        by_fold = [members[folds[members] == f] for f in range(k)]
        quota = np.full(k, limit // k)
        quota[rng.permutation(k)[:limit % k]] += 1
        take = np.minimum(quota, [len(m) for m in by_fold])
        while take.sum() < limit:  # a fold short of its share: the others make it up
            spare = [f for f in rng.permutation(k) if take[f] < len(by_fold[f])]
            for f in spare[:limit - take.sum()]:
                take[f] += 1
        chosen += [rng.choice(m, n, replace=False) for m, n in zip(by_fold, take, strict=True)
                   if n]
    return np.sort(np.concatenate(chosen)) if chosen else np.empty(0, dtype=np.int64)


def cv_partition(labels: np.ndarray, folds: np.ndarray, fold: int,
                 per_class_limit: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test rows for cross-validation fold ``fold`` (paper 001).

    Test = the samples of fold ``fold``; train = the samples of the other folds. With
    ``per_class_limit`` X, only up to X samples per class (chosen with ``seed``, the same
    for every fold, spread evenly over the folds) take part in the folds; the rest all
    go to the test set, as in paper 001's small-data experiments.

    Raises:
        CapsmedError: if ``fold`` is outside the file's folds or holds no sample.
    """
    k = int(folds.max()) + 1 if len(folds) else 0
    if not 0 <= fold < k:
        raise CapsmedError(f"--fold {fold}: the file has folds 0..{k - 1}")
    if not (folds == fold).any():  # it would train on every row and test on none
        raise CapsmedError(f"--fold {fold}: no sample of the file is in fold {fold} "
                           f"(folds 0..{k - 1}); there is nothing to hold out")
    pool = np.zeros(len(labels), dtype=bool)
    pool[limit_per_class_over_folds(labels, folds, per_class_limit, seed) if per_class_limit
         else np.arange(len(labels))] = True
    in_fold = folds == fold
    return np.flatnonzero(pool & ~in_fold), np.flatnonzero(in_fold | ~pool)
