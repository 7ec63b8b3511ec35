"""Whole-slide images through OpenSlide: tissue tiles at a level or mpp, labelled by
point or region annotations or per-slide labels, split by slide."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.wsi.config import WsiConfig

SOURCE = register(Source(
    name="wsi", package=__name__, domain="generic", config=WsiConfig,
    preprocess="reader:preprocess_wsi", synth="synth:write_wsi", recipe="recipe:SlideTiles",
    chooses_domain=True))
