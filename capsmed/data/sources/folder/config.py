"""The parameters of ``capsmed preprocess folder`` (any folder of class subfolders)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from capsmed.data.domains import DEFAULT_DOMAIN, get_domain
from capsmed.data.normalise_options import check_stain_norm
from capsmed.data.sources.common import check_fractions, default_fractions
from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class FolderConfig:
    """Every parameter of class-folder preprocessing; all of it is recorded in the file.

    Attributes:
        classes: Class folders to use, in label order; None = every subfolder, sorted.
        channels: 1 (grey) or 3 (RGB); None = taken from the first image (grey -> 1,
            colour -> 3), and every other image is converted to it.
        size: Output side (square); None keeps the native size, which then must be the
            same for every image.
        keep_aspect: Resize the longer side to ``size`` and pad the shorter one centrally
            with black, instead of stretching to a square.
        scale16: How 16-bit images become 8-bit: ``full`` maps 0..65535 to 0..255
            (``round(v / 257)``; absolute intensities kept), ``minmax`` stretches each
            image's own min..max to 0..255.
        group_pattern: Regex with one capture group, searched in each file name; the
            capture is the sample's group (patient).
        groups_csv: CSV of ``file,group`` rows, file paths relative to ROOT.
        fractions: Group-level split fractions (sum to 1), used unless ``split_files``
            or ``folds`` is given.
        split_files: ``{split: path}`` lists of group ids, one per line.
        folds: Write one split ``all`` with stratified group k-fold indices instead.
        seed: Seed for the split / fold assignment.
        name: Dataset name recorded in the file; None = ROOT's folder name.
        workers: Processes reading images (0 = one per CPU, up to 8).
        allow_group_leak: Write even if a group lands in two splits.
        domain: What the images show (:mod:`capsmed.data.domains`): training's default
            learning rate and augmentation follow it (generic: no flips; digits: never
            flipped).
        stain_norm: Stain normalisation of the RGB images, first: ``none``,
            ``macenko`` or ``reinhard`` (:mod:`capsmed.data.normalise`) towards the
            target; each image (before resizing) gives its own statistics.
        stain_target: The target: an RGB reference image, or a JSON file of its
            statistics (a file's recorded ``stain_normalisation``).
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset((
        "folds", "group_pattern", "groups_csv", "name"))

    classes: tuple[str, ...] | None = None
    channels: int | None = None
    size: int | None = None
    keep_aspect: bool = False
    scale16: str = "full"
    group_pattern: str | None = None
    groups_csv: str | None = None
    fractions: dict[str, float] = field(default_factory=default_fractions)
    split_files: dict[str, str] | None = None
    folds: int | None = None
    seed: int = 0
    name: str | None = None
    workers: int = 0
    allow_group_leak: bool = False
    domain: str = DEFAULT_DOMAIN
    stain_norm: str = "none"
    stain_target: str | None = None

    def __post_init__(self) -> None:
        if self.seed < 0:  # NumPy's generator failed on it with a traceback
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")
        if self.classes is not None and not self.classes:  # it read as every subfolder
            raise CapsmedError("classes names no class folder; name them, or leave the "
                               "option out for every subfolder")
        if self.channels not in (None, 1, 3):
            raise CapsmedError(f"channels must be 1 or 3, got {self.channels}")
        if self.size is not None and not 4 <= self.size <= 4096:
            raise CapsmedError(f"size must be within 4..4096, got {self.size}")
        if self.keep_aspect and self.size is None:
            raise CapsmedError("keep_aspect needs a size to fit the images into")
        if self.scale16 not in ("full", "minmax"):
            raise CapsmedError(f"scale16 must be 'full' or 'minmax', got {self.scale16!r}")
        if self.group_pattern == "":  # it read as no pattern: one group per image
            raise CapsmedError("group_pattern is empty; give a regex with one capture "
                               "group, or leave it out for one group per image")
        if self.group_pattern and self.groups_csv:
            raise CapsmedError("give either a group pattern or a groups CSV, not both")
        check_fractions(self.fractions)
        check_stain_norm(self.stain_norm, self.stain_target)
        if self.stain_norm != "none" and self.channels == 1:
            raise CapsmedError("stain normalisation works on colour images; drop "
                               "--channels 1 (or --stain-norm)")
        get_domain(self.domain)
        if self.folds is not None and (self.folds < 2 or self.folds > 127):
            raise CapsmedError(f"folds must be within 2..127, got {self.folds}")
        if self.folds is not None and self.split_files:
            raise CapsmedError("folds and split files exclude each other")


def as_applied(values: dict[str, Any]) -> dict[str, Any]:
    """Recorded parameters as they were applied: a file written before an empty
    ``group_pattern`` or ``classes`` was refused records it, and it meant none given
    (one group per image, every subfolder); ``capsmed predict`` replays it so."""
    out = dict(values)
    if out.get("group_pattern") == "":
        out["group_pattern"] = None
    if out.get("classes") is not None and not out["classes"]:
        out["classes"] = None
    return out
