"""The training preprocessing, replayed on new inputs: what ``capsmed predict`` scores.

A recipe turns one input file into model inputs exactly as ``capsmed preprocess``
turned the training files into the dataset, calling the same functions with the
parameters the dataset recorded. Each source registers its recipe
(:mod:`capsmed.data.sources`); :func:`make_recipe` finds it from the record alone:

* tupac16: hematoxylin channel -> windows over the tissue mask -> INTER_AREA resize;
* diaretdb1: CLAHE green over the field of view -> windows inside it -> resize;
* wsi: the slide's tissue mask -> the tile grid at the recorded level/mpp ->
  ``read_region`` -> resize -> RGB or hematoxylin;
* image-level sources (aml, folders, the MNIST family): one prediction per image.

Windows are centred on a regular grid (``--stride``) or on given centres. Window
centres are (x, y) in the input's level-0 pixels.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import numpy as np

from capsmed.data.record import DatasetRecord
from capsmed.data.replay.options import Overrides
from capsmed.data.replay.windows import Prepared
from capsmed.errors import CapsmedError

# each override, the flag that sets it and the kind of run it applies to
_FLAGS = {"stride": "--stride", "min_tissue": "--min-tissue", "level": "--level",
          "mpp": "--mpp", "fov_mask": "--fov-mask"}
_WHERE = {"stride": "windowed runs", "min_tissue": "windowed runs",
          "level": "runs that read whole slides", "mpp": "runs that read whole slides",
          "fov_mask": "diaretdb1 runs (fundus field of view)"}


class Recipe(Protocol):
    """What a source's recipe provides (a class: ``accepts`` is read before it is built).

    Attributes:
        windowed: Windows over an input (heatmaps, GeoJSON), else one per image.
        slides: Reads whole slides (svs, ndpi, pyramidal TIFF, ...).
        accepts: The overrides (fields of :class:`Overrides`) it honours.
    """

    windowed: bool
    slides: bool
    accepts: frozenset[str]

    def prepare(self, path: Path, centres: np.ndarray | None) -> Prepared:
        """Read ``path``; its windows (on a grid, or centred on ``centres``)."""
        ...


def check_overrides(overrides: Overrides) -> None:
    """Refuse override values that are wrong for any run."""
    if overrides.stride is not None and overrides.stride < 1:
        raise CapsmedError(f"--stride must be >= 1, got {overrides.stride}")
    if overrides.min_tissue is not None and not 0.0 <= overrides.min_tissue <= 1.0:
        raise CapsmedError(f"--min-tissue must be within [0, 1], got {overrides.min_tissue}")
    # a negative level indexes the pyramid from its end in Python, and OpenSlide reads
    # nothing (white) at it: windows of blank padding, scored without a word
    if overrides.level is not None and overrides.level < 0:
        raise CapsmedError(f"--level must be >= 0 (0 is full resolution), got "
                           f"{overrides.level}")
    if overrides.mpp is not None and not 0 < overrides.mpp < math.inf:
        raise CapsmedError(f"--mpp must be a number > 0, got {overrides.mpp}")


def make_recipe(record: DatasetRecord, overrides: Overrides) -> Recipe:
    """The recipe that replays ``record``'s preprocessing, or a refusal naming why."""
    check_overrides(overrides)
    source = record.data_source()
    factory = source.hook("recipe")
    accepts = getattr(factory, "accepts", frozenset())
    for name, flag in _FLAGS.items():
        if getattr(overrides, name) is not None and name not in accepts:
            kind = "" if source.name == record.dataset else f", {source.name} source"
            raise CapsmedError(f"{flag} applies to {_WHERE[name]}, not to this run "
                               f"(dataset {record.dataset!r}{kind})")
    return factory(record, overrides)
