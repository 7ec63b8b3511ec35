"""scikit-learn's handwritten digits (``sklearn.datasets.load_digits``): 1,797 real
8x8 scans that ship with scikit-learn, so a study on real data runs anywhere, offline.
"""

from capsmed.data.sources import Source, register
from capsmed.data.sources.digits.config import DigitsConfig

SOURCE = register(Source(
    name="digits", package=__name__, domain="digits", config=DigitsConfig,
    preprocess="reader:preprocess_digits",
    recipe="recipe:ScanImage"))
