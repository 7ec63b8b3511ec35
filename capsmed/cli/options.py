"""Options the source commands share, declared once (TIAToolbox's ``cli/common.py``).

Each factory returns the ``typer.Option`` of one concept (output, seed, workers, split
fractions, split files, group leaks, missing annotations, overwriting), and every help
text ends with its default in brackets, read from the field of the config dataclass
the option overrides (STYLE 13): ``with_default("Seed of the split", Tupac16Config,
"seed")`` is ``"Seed of the split [0]."``. Options default to None, so an option the
user did not give never replaces the dataclass default (STYLE 4); typer's own
``[default: ...]`` is switched off so that each help shows one default, in one style.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import typer

WORKERS_MEANING = "one per CPU, up to 8"
_SPLIT_USE = {"train": "training", "val": "validation", "test": "testing"}

# Every command that writes takes -o, --output and --out alike (one convention).
OUTPUT_FLAGS = ("--output", "--out", "-o")
# ``-o/--output`` of every source: one object, as it depends on nothing (a factory call
# in a signature with a Path annotation would trip ruff's B008).
OUTPUT = typer.Option(..., *OUTPUT_FLAGS, help="The .h5 file to write.",
                      show_default=False)


def field_default(config: type, name: str) -> Any:
    """The default of field ``name`` of the dataclass ``config``."""
    for f in dataclasses.fields(config):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    raise KeyError(f"{config.__name__} has no field {name!r} with a default")


def show_value(value: Any) -> str:
    """A default as a user would type it: ``0.15``, ``5000``, ``a,b`` for a tuple."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return ",".join(show_value(v) for v in value)
    return str(value)


def with_default(text: str, config: type, name: str, *, meaning: str | None = None,
                 key: str | None = None, flags: tuple[str, str] | None = None,
                 show: Callable[[Any], str] = show_value) -> str:
    """``text`` followed by the default of ``config.name`` in brackets.

    Args:
        text: The help text, without a final full stop.
        config: The config dataclass the option overrides.
        name: Its field.
        meaning: What the default means, shown after it (``[0 = one per CPU, up to
            8]``), or instead of it when the default is None (``[tile size]``).
        key: Show ``default[key]`` (one split of a fractions dict).
        flags: ``(on, off)`` names of a boolean flag pair; the one in effect is shown.
        show: Formats the default (the CLI's own notation, e.g. ``8x8``).
    """
    value = field_default(config, name)
    if key is not None:
        value = value[key]
    if flags is not None:
        shown = flags[0] if value else flags[1]
    elif value is None:
        if meaning is None:
            raise ValueError(f"{config.__name__}.{name} defaults to None: say what that "
                             "means")
        shown = meaning
    else:
        shown = show(value) + (f" = {meaning}" if meaning else "")
    return f"{text} [{shown}]."


def option(config: type, name: str, text: str, *decls: str, **shown: Any) -> Any:
    """A ``typer.Option`` overriding ``config.name`` (None unless given), its help ending
    with the field's default (``shown`` goes to :func:`with_default`)."""
    return typer.Option(None, *decls, help=with_default(text, config, name, **shown),
                        show_default=False)


def flag(config: type, name: str, text: str, on: str | None = None,
         off: str | None = None) -> Any:
    """A ``--on/--off`` flag pair overriding the boolean ``config.name``."""
    on = on or name.replace("_", "-")
    off = off or f"no-{on}"
    return option(config, name, text, f"--{on}/--{off}", flags=(on, off))


def device_option() -> Any:
    """``--device`` of every command that runs a model (one default: TrainConfig's)."""
    from capsmed.train.config import TrainConfig  # standard library only

    return option(TrainConfig, "device", "Where the model runs: auto (CUDA, then MPS, then "
                  "CPU), cpu, cuda, cuda:1 or mps")


def overwrite_option() -> Any:
    """``--overwrite``: replace an existing output file (runs may point to it)."""
    return typer.Option(False, "--overwrite", help="Replace the output file if it exists "
                        "(without this, an existing file is an error: runs may point to "
                        "it).", show_default=False)


def seed_option(config: type, what: str) -> Any:
    """``--seed``: what it seeds, e.g. ``"the split"``."""
    return option(config, "seed", f"Seed for {what}")


def workers_option(config: type) -> Any:
    """``--workers``: worker processes; the output does not depend on their number."""
    return option(config, "workers", "Worker processes", meaning=WORKERS_MEANING)


def fraction_option(config: type, split: str, unit: str) -> Any:
    """``--train``, ``--val`` or ``--test``: the share of ``unit`` s (cases, slides...)."""
    return option(config, "fractions", f"Fraction of {unit}s for {_SPLIT_USE[split]}",
                  key=split)


def split_fractions(config: type, train: float | None, val: float | None,
                    test: float | None) -> dict[str, float] | None:
    """The fractions given on the command line, the others filled in from the config's
    default; None when none was given. The config checks that they sum to 1
    (:func:`capsmed.data.sources.common.check_fractions`), for every source."""
    given = {k: v for k, v in (("train", train), ("val", val), ("test", test))
             if v is not None}
    return {**field_default(config, "fractions"), **given} if given else None


def split_file_option(unit: str, replaces: str = "the fractions") -> Any:
    """``--split-file SPLIT=FILE`` (repeatable): the user's own lists of ``unit`` ids.

    Its parameter is a list, which ruff's B008 does not trust in a default: mark the
    line ``# noqa: B008`` (a typer.Option, like those pyproject.toml exempts).
    """
    return typer.Option(None, help=f"SPLIT=FILE listing {unit} ids, one per line; repeat "
                        f"for train, val, test. Replaces {replaces}.", show_default=False)


def allow_group_leak_option(config: type, unit: str) -> Any:
    """``--allow-group-leak``: write even if a ``unit`` lands in two splits."""
    article = "an" if unit[0] in "aeiou" else "a"
    return flag(config, "allow_group_leak", f"Write even if {article} {unit} is in two "
                "splits (not recommended)")


def allow_no_annotations_option(config: type, looked_for: str) -> Any:
    """``--allow-no-annotations``: write a set whose annotations are all absent."""
    return flag(config, "allow_no_annotations", f"Write even if no {looked_for} is found "
                "(without this, that is an error naming where they were looked for)")


def domain_option(config: type) -> Any:
    """``--domain``: what the images show; training's defaults follow it."""
    from capsmed.data.domains import DOMAINS

    names = ", ".join(DOMAINS)
    return option(config, "domain", f"What the images show ({names}), recorded in the "
                  "file: training's default lr and --augment recipe follow it (digits are "
                  "never flipped, generic sets only rotated; docs/sources.md)")


def synth_seed_option() -> Any:
    """``--seed`` of ``capsmed synth``: the same seed writes the same files."""
    return typer.Option(0, help="Random seed; same seed, same files.")
