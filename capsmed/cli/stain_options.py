"""``--stain-norm`` and ``--stain-target``: the stain normalisation options of the
histology sources (tupac16, wsi, folder), declared once; defaults read from each
source's config (:mod:`capsmed.cli.options`)."""

from __future__ import annotations

from typing import Any

from capsmed.cli.options import option


def stain_norm_option(config: type) -> Any:
    """``--stain-norm none|macenko|reinhard``."""
    return option(config, "stain_norm", "Stain normalisation of the RGB images towards "
                  "--stain-target: none, macenko or reinhard (recorded; predict replays "
                  "it)")


def stain_target_option(config: type) -> Any:
    """``--stain-target FILE``: a reference image or a JSON of its statistics."""
    return option(config, "stain_target", "Target of --stain-norm: an RGB reference "
                  "image, or a JSON file of its statistics (a dataset's recorded "
                  "stain_normalisation)", meaning="none")
