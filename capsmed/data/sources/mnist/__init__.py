"""The MNIST family: MNIST and Fashion-MNIST (IDX files), affNIST (MATLAB files) and
MultiMNIST (two overlaid MNIST digits, Sabour et al.)."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.mnist.config import AffnistConfig, MnistConfig, MultiMnistConfig

MNIST = register(Source(
    name="mnist", package=__name__, domain="digits", config=MnistConfig,
    preprocess="reader:preprocess_mnist", synth="synth:write_mnist_like",
    recipe="recipe:DigitImage"))
FASHION = register(Source(
    name="fashion-mnist", package=__name__, domain="objects", config=MnistConfig,
    preprocess="reader:preprocess_mnist", synth="synth:write_fashion_mnist",
    recipe="recipe:DigitImage"))
AFFNIST = register(Source(
    name="affnist", package=__name__, domain="digits", config=AffnistConfig,
    preprocess="affnist:preprocess_affnist", synth="synth:write_affnist",
    recipe="recipe:DigitImage"))
MULTIMNIST = register(Source(
    name="multimnist", package=__name__, domain="digits", config=MultiMnistConfig,
    preprocess="multimnist:preprocess_multimnist", synth="synth:write_mnist_like",
    no_recipe="a multimnist run names two overlapping digits per image; predict handles "
              "single-label runs"))
