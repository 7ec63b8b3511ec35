"""The parameters of ``capsmed preprocess medmnist`` (a published MedMNIST .npz file)."""

from __future__ import annotations

from dataclasses import dataclass

from capsmed.data.domains import get_domain
from capsmed.data.sources.medmnist.sets import SETS, SETS_3D
from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class MedmnistConfig:
    """Every parameter of MedMNIST preprocessing; all of it is recorded in the file.

    The official train/val/test splits are kept as published and the images are stored
    as they are (no resizing: each size is its own published file), so there is little
    to choose.

    Attributes:
        set_name: Which set the file holds (``bloodmnist``, ...); None = from the file
            name (``<set>.npz`` or ``<set>_<size>.npz``, as published).
        ordinal_as_classes: Train RetinaMNIST's five ordinal grades as five classes (the
            MedMNIST v2 benchmark trains it with cross-entropy too); without it the
            ordinal set is refused.
        domain: Image domain recorded in the file (:mod:`capsmed.data.domains`); None =
            the set's own (blood and tissue cells: cytology, pathology: histology,
            retina: fundus, the rest generic).
    """

    set_name: str | None = None
    ordinal_as_classes: bool = False
    domain: str | None = None

    def __post_init__(self) -> None:
        if self.set_name is not None and self.set_name not in SETS \
                and self.set_name not in SETS_3D:
            raise CapsmedError(f"unknown MedMNIST set {self.set_name!r} (2D sets: "
                               f"{', '.join(SETS)})")
        if self.domain is not None:
            get_domain(self.domain)
