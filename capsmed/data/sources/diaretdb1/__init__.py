"""DIARETDB1 v1.1 fundus photographs: CLAHE green-channel patches, lesion vs healthy
(paper 000), on the official train/test lists."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.diaretdb1.config import Diaretdb1Config

SOURCE = register(Source(
    name="diaretdb1", package=__name__, domain="fundus", config=Diaretdb1Config,
    preprocess="reader:preprocess_diaretdb1", synth="synth:write_diaretdb1",
    recipe="recipe:FundusPatches"))
