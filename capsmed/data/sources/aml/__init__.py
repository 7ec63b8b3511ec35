"""AML-Cytomorphology_LMU: 15 classes of single leukocyte images, stratified
cross-validation folds (paper 001)."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.aml.config import AmlConfig

SOURCE = register(Source(
    name="aml", package=__name__, domain="cytology", config=AmlConfig,
    preprocess="reader:preprocess_aml", synth="synth:write_aml", recipe="recipe:CellImage"))
