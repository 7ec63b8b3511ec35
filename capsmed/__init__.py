"""capsmed: capsule networks vs ConvNets for medical image classification."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("capsmed")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"
