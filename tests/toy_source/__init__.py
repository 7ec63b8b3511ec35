"""A toy data source, registered from the test suite the way a new source is added to
capsmed (docs/develop.md): a package with config, reader, synth and recipe modules and
one registration line. tests/test_source_registry.py drives it end to end."""

from capsmed.data.sources import Source, register
from tests.toy_source.config import ToyConfig

SOURCE = register(Source(
    name="toy-dots", package=__name__, domain="generic", config=ToyConfig,
    preprocess="reader:preprocess_toy", synth="synth:write_toy", recipe="recipe:ToyImage"))
