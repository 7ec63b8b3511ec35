"""Image domains: what kind of images a dataset holds, and the training defaults that
follow from it.

A dataset file records its domain (``capsmed preprocess folder|wsi --domain``; every
other source records its own), and ``capsmed train`` takes its default learning rate,
reconstruction weight and augmentation recipe from that record, never from the
dataset's name. Paper 000 (Jimenez-Sanchez et al. 2018, section 3) trains the MNIST
family at Sabour et al.'s lr 1e-3 and reconstruction weight 5e-4 and the medical sets
at a tenth of both; its augmentation is +-10 degree rotations plus flips where a
flipped image is still a valid image of its class.

Standard library only: the command line reads the domain names for its help.
"""

from __future__ import annotations

from dataclasses import dataclass

from capsmed.errors import CapsmedError

PAPER_LR, PAPER_RECON_WEIGHT = 1e-3, 5e-4  # Sabour et al., paper 000 for MNIST-family data


@dataclass(frozen=True)
class Domain:
    """Training defaults of one kind of image.

    Attributes:
        name: What files record (``digits``, ``histology``, ...).
        lr: Default learning rate.
        recon_weight: Default reconstruction-loss weight.
        augment_recipe: Recipe of :mod:`capsmed.train.augment` used by ``--augment``.
        about: One line for ``--help`` and the docs.
    """

    name: str
    lr: float
    recon_weight: float
    augment_recipe: str
    about: str


DOMAINS: dict[str, Domain] = {d.name: d for d in (
    Domain("digits", PAPER_LR, PAPER_RECON_WEIGHT, "paper000-mnist",
           "handwritten digits or characters: rotations, never flipped (a mirrored 6 "
           "is no digit)"),
    Domain("objects", PAPER_LR, PAPER_RECON_WEIGHT, "paper000-fashion",
           "photographs of objects (Fashion-MNIST): rotations, left-right flips"),
    Domain("histology", PAPER_LR / 10, PAPER_RECON_WEIGHT / 10, "paper000-medical",
           "stained tissue (H&E patches, slides): rotations, both flips"),
    Domain("fundus", PAPER_LR / 10, PAPER_RECON_WEIGHT / 10, "paper000-medical",
           "retinal fundus photographs: rotations, both flips"),
    Domain("cytology", PAPER_LR, PAPER_RECON_WEIGHT, "paper001",
           "single cells (blood smears): any rotation, both flips (paper 001)"),
    Domain("generic", PAPER_LR / 10, PAPER_RECON_WEIGHT / 10, "paper000-rotation",
           "anything else (medical by default): rotations only, no flips"),
)}
DEFAULT_DOMAIN = "generic"


def get_domain(name: str) -> Domain:
    """The domain called ``name``, or a one-line refusal listing the known ones."""
    try:
        return DOMAINS[name]
    except KeyError:
        raise CapsmedError(f"unknown domain '{name}' (choose from: "
                           f"{', '.join(DOMAINS)})") from None
