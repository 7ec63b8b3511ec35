"""The parameters of ``capsmed preprocess wsi`` (whole-slide images to tiles)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from capsmed.data.domains import DEFAULT_DOMAIN, get_domain
from capsmed.data.normalise_options import check_stain_norm
from capsmed.data.sources.common import DEFAULT_H_MAX, check_fractions, default_fractions
from capsmed.errors import CapsmedError


@dataclass(frozen=True)
class WsiConfig:
    """Every parameter of WSI tiling; all of it is recorded in the dataset file.

    Attributes:
        level: Pyramid level to tile at (default 0 unless ``mpp`` is given).
        mpp: Microns per pixel to tile at: the nearest finer level is read and resampled.
        tile_size: Tile side in pixels at the chosen resolution.
        stride: Grid step at the chosen resolution (default ``tile_size``: no overlap).
        output_size: Stored side after INTER_AREA resizing (default ``tile_size``).
        min_tissue: Minimum tissue fraction of a kept tile.
        mask_downsample: Tissue-mask resolution relative to level 0.
        mask_blur: Median blur (odd px, mask resolution) of the saturation before Otsu.
        min_saturation: Floor on the Otsu threshold (0-255) so that an almost empty
            slide does not turn its glass noise into "tissue".
        min_object_area: Tissue specks up to this area (mask px) are removed.
        max_hole_area: Holes up to this area (mask px) are filled.
        points_csv: ``slide,x,y,label`` point annotations (level-0 px).
        geojson: GeoJSON files and/or folders, matched to slides by file stem.
        slide_labels_csv: ``slide,label``: one label for every tile of a slide.
        min_overlap: Polygon labels: least share of the tile the class must cover
            (None: the class of the polygon under the tile centre).
        unlabelled: Tiles no point or polygon labels: ``background`` or ``drop``.
        background_class: Class name given to unlabelled tiles.
        stain: ``none`` (RGB, 3 channels) or ``hematoxylin`` (1 channel).
        h_max: Hematoxylin density mapped to black.
        fractions: Slide-level split fractions (summing to 1), used unless
            ``split_files`` is given.
        split_files: ``{split: path}`` lists of slide ids, one per line.
        seed: Seed of the slide split.
        workers: Worker processes (0 = one per CPU, up to 8).
        tiles_per_job: Tiles read per worker job (big slides become several jobs).
        allow_group_leak: Write even if a slide lands in two splits.
        allow_no_annotations: Write even when the GeoJSON files hold no classified
            polygon for any slide (every tile then takes the background class);
            without it that is an error naming where the files were looked for.
        domain: What the slides show (:mod:`capsmed.data.domains`): training's default
            learning rate and augmentation follow it (generic: no flips).
        stain_norm: Stain normalisation of the RGB images, first: ``none``,
            ``macenko`` or ``reinhard`` (:mod:`capsmed.data.normalise`) towards the
            target; each tile (after resizing) gives its own statistics.
        stain_target: The target: an RGB reference image, or a JSON file of its
            statistics (a file's recorded ``stain_normalisation``).
    """

    # recorded parameters that decide which images (or how many) go to which split, not
    # how an image looks (capsmed.data.sources.Source.split_parameters)
    SPLIT_ONLY: ClassVar[frozenset[str]] = frozenset((
        "allow_no_annotations", "tiles_per_job"))

    level: int | None = None
    mpp: float | None = None
    tile_size: int = 256
    stride: int | None = None
    output_size: int | None = None
    min_tissue: float = 0.5
    mask_downsample: float = 16.0
    mask_blur: int = 5
    min_saturation: int = 20
    min_object_area: int = 16
    max_hole_area: int = 16
    points_csv: str | None = None
    geojson: tuple[str, ...] | None = None
    slide_labels_csv: str | None = None
    min_overlap: float | None = None
    unlabelled: str = "background"
    background_class: str = "background"
    stain: str = "none"
    h_max: float = DEFAULT_H_MAX
    fractions: dict[str, float] = field(default_factory=default_fractions)
    split_files: dict[str, str] | None = None
    seed: int = 0
    workers: int = 0
    tiles_per_job: int = 256
    allow_group_leak: bool = False
    allow_no_annotations: bool = False
    domain: str = DEFAULT_DOMAIN
    stain_norm: str = "none"
    stain_target: str | None = None

    def __post_init__(self) -> None:
        if self.seed < 0:  # NumPy's generator failed on it with a traceback
            raise CapsmedError(f"seed must be >= 0, got {self.seed}")
        checks = [
            (self.level is not None and self.mpp is not None, "give --level or --mpp, not both"),
            (self.level is not None and self.level < 0, "level must be >= 0"),
            (self.mpp is not None and not self.mpp > 0, "mpp must be > 0"),
            (self.tile_size < 8, "tile_size must be >= 8"),
            (self.stride is not None and self.stride < 1, "stride must be >= 1"),
            (self.output_size is not None and self.output_size < 4, "output_size must be >= 4"),
            (not 0.0 <= self.min_tissue <= 1.0, "min_tissue must be within [0, 1]"),
            (not 1 <= self.mask_downsample < math.inf,  # NaN: a traceback; inf: no mask
             f"mask_downsample must be a number >= 1, got {self.mask_downsample}"),
            (self.mask_blur < 1 or self.mask_blur % 2 == 0, "mask_blur must be odd and >= 1"),
            (not 0 <= self.min_saturation <= 255, "min_saturation must be within 0-255"),
            (self.min_object_area < 0 or self.max_hole_area < 0, "areas must be >= 0"),
            (sum(v is not None for v in (self.points_csv, self.geojson,
                                         self.slide_labels_csv)) != 1,
             "give exactly one of --labels-csv, --geojson, --slide-labels"),
            (self.min_overlap is not None and not 0 < self.min_overlap <= 1,
             "min_overlap must be within (0, 1]"),
            (self.min_overlap is not None and self.geojson is None,
             "min_overlap applies to --geojson polygon labels only"),
            (self.unlabelled not in ("background", "drop"), "unlabelled must be background "
                                                            "or drop"),
            (not self.background_class.strip(), "background_class must not be empty"),
            (self.stain not in ("none", "hematoxylin"), "stain must be none or hematoxylin"),
            (not 0 < self.h_max < math.inf, f"h_max must be a number > 0, got {self.h_max}"),
            (self.tiles_per_job < 1, "tiles_per_job must be >= 1"),
            # options that would be recorded in the file but change nothing (as min_overlap)
            (self.h_max != DEFAULT_H_MAX and self.stain != "hematoxylin",
             "h_max applies to --stain hematoxylin only"),
            (self.slide_labels_csv is not None and (self.unlabelled != "background"
                                                    or self.background_class != "background"),
             "unlabelled and background_class apply to --labels-csv and --geojson; with "
             "--slide-labels every tile takes its slide's label"),
            (self.unlabelled == "drop" and self.background_class != "background",
             "background_class has no effect with --unlabelled drop"),
        ]
        for bad, message in checks:
            if bad:
                raise CapsmedError(message)
        check_fractions(self.fractions)
        check_stain_norm(self.stain_norm, self.stain_target)
        get_domain(self.domain)

    @property
    def step(self) -> int:
        return self.stride or self.tile_size

    @property
    def out_size(self) -> int:
        return self.output_size or self.tile_size


def as_applied(values: dict[str, Any]) -> dict[str, Any]:
    """Recorded parameters with the options that changed nothing back at their defaults:
    a file written before they were refused (``h_max`` without ``--stain
    hematoxylin``, ``unlabelled`` or ``background_class`` beside ``--slide-labels``,
    ``background_class`` with ``--unlabelled drop``) records them as given, and
    ``capsmed predict`` replays it as it was made."""
    out = dict(values)
    if out.get("stain", "none") != "hematoxylin":
        out.pop("h_max", None)
    if out.get("slide_labels_csv") is not None:
        out.pop("unlabelled", None)
        out.pop("background_class", None)
    if out.get("unlabelled") == "drop":
        out.pop("background_class", None)
    return out
