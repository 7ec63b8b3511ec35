"""TUPAC16 auxiliary mitosis set: H&E images at 40x, mitosis vs tissue patches of the
hematoxylin channel (paper 000)."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.tupac16.config import Tupac16Config

SOURCE = register(Source(
    name="tupac16", package=__name__, domain="histology", config=Tupac16Config,
    preprocess="reader:preprocess_tupac16", synth="synth:write_tupac16",
    recipe="recipe:HematoxylinPatches", scan_mpp=0.25))
