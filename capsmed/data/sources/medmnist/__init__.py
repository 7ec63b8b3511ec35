"""MedMNIST v2 2D sets (and their MedMNIST+ 64/128/224 px files): the published .npz
archives with their official splits. Each file records its set's own image domain
(BloodMNIST cytology, PathMNIST histology, ...; ``sets.py``)."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.medmnist.config import MedmnistConfig

SOURCE = register(Source(
    name="medmnist", package=__name__, domain="generic", config=MedmnistConfig,
    preprocess="reader:preprocess_medmnist", synth="synth:write_medmnist",
    recipe="recipe:MedmnistImage"))
