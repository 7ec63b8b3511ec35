"""capsmed: capsule networks vs ConvNets for medical image classification."""

import os
from importlib.metadata import PackageNotFoundError, version

# OpenMP's default spin-waiting makes torch's CPU ops up to 18x slower on small
# VMs (measured: a 1.7M-parameter CapsNet trains at 50 img/s on 2 cores with the
# default, 990 img/s with PASSIVE). It must be set before torch loads; an explicit
# setting in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    __version__ = version("capsmed")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"
