"""The stain normalisation options the histology sources share (``--stain-norm``,
``--stain-target``), checked once. Standard library only: source configs import it,
and the command line reads their defaults for its help."""

from __future__ import annotations

from capsmed.errors import CapsmedError

STAIN_NORMS = ("none", "macenko", "reinhard")


def check_stain_norm(method: str, target: str | None) -> None:
    """A known method, and a target exactly when a method is chosen.

    Raises:
        CapsmedError: saying which option is wrong.
    """
    if method not in STAIN_NORMS:
        raise CapsmedError(f"stain_norm must be one of {', '.join(STAIN_NORMS)}, got "
                           f"{method!r}")
    if method != "none" and not target:
        raise CapsmedError(f"stain normalisation '{method}' needs a target: an RGB image "
                           "or a JSON file of its statistics (--stain-target)")
    if method == "none" and target:
        raise CapsmedError("--stain-target given without a method; add --stain-norm "
                           "macenko or reinhard")
