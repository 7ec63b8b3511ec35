"""``capsmed train``: one training run -> a self-describing run directory.

Every field of :class:`capsmed.train.config.TrainConfig` is an option, generated with
its help and default from the dataclass (:mod:`capsmed.cli.config_options`); this
module adds only what is not a field: ``--config``, ``--resume``, ``--model-arg``,
``--branches``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from capsmed.cli.common import echo_wrapped, handles_errors, parse_key_values
from capsmed.cli.config_options import Extra, config_options, with_options
from capsmed.data.challenges import parse_imbalance
from capsmed.errors import CapsmedError, shell_quoted
from capsmed.train.config import TrainConfig


def parse_patience(text: str) -> int | None:
    """``--patience 20`` -> 20; ``--patience none`` -> None, which never stops early (an
    int option could not say what its help promised; only a YAML could)."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise CapsmedError(f"--patience must be a number of epochs or none, got "
                           f"'{text}'") from None


# What the command line says of a field beyond the dataclass.
EXTRAS = {
    "data": Extra(help="Dataset .h5 (from capsmed preprocess)", cli_type=Path, parse=str),
    "out": Extra(decls=("--output", "-o"), cli_type=Path, parse=str),
    "transfer_from": Extra(cli_type=Path, parse=str),
    "arch": Extra(help="Architecture (see: capsmed models)"),
    "lr": Extra(meaning="the data's image domain's: 1e-3 digits, 1e-4 medical sets"),
    "recon_weight": Extra(meaning="the domain's: 5e-4 digits, 5e-5 medical sets"),
    "imbalance": Extra(help="Reduce classes: CLASS=PERCENT[,CLASS=PERCENT] (paper 000: one "
                       "class to 20)", cli_type=str, parse=parse_imbalance),
    "augment_recipe": Extra(decls=("--augment-spec",)),
    "channels_last": Extra(meaning="on CUDA"),
    "patience": Extra(help="Stop when validation loss has not improved for this many "
                      "epochs (paper 000: 20); none never stops early", cli_type=str,
                      parse=parse_patience, metavar="<int|none>"),
    "transfer_layers": Extra(help="Parameter-name prefixes copied from --transfer-from, "
                             "comma-separated (e.g. conv1,primary)", cli_type=str,
                             parse=lambda text: [p.strip() for p in text.split(",")
                                                 if p.strip()]),
}
OPTIONS = config_options(TrainConfig, skip=("model_kwargs",), extras=EXTRAS)


@handles_errors
@with_options(OPTIONS)
def train(
    config: Path = typer.Option(None, help="YAML file of these options; flags override it."),
    resume: Path = typer.Option(None, help="Continue an interrupted run directory (all other "
                                "options come from its config.yaml)."),
    model_arg: list[str] = typer.Option(None, help="Architecture option key=value, "
                                        "repeatable (e.g. conv_channels=64)."),
    branches: int = typer.Option(None, help="Parallel branches (parallel-dr; paper 001's "
                                 "best: 12). Same as --model-arg branches=N."),
    options: dict[str, Any] | None = None,
) -> None:
    """Train a model; keeps the checkpoint at minimum validation loss."""
    from capsmed.train.config import read_options_yaml
    from capsmed.train.engine import resume as resume_training
    from capsmed.train.engine import train as run_training

    given = dict(options or {})
    base = read_options_yaml(config) if config else {}
    if given.get("augment") is False:  # --no-augment overrides a recipe in the YAML
        if given.get("augment_recipe"):
            raise CapsmedError("--no-augment and --augment-recipe contradict each other; "
                               "drop one")
        base.pop("augment_recipe", None)
    if given.get("augment_recipe"):
        given["augment"] = True
    if resume is not None:
        if given or base or model_arg or branches is not None:
            raise CapsmedError("--resume continues a run with its own options (its "
                               "config.yaml); give no other training options")
        run_dir = resume_training(resume)
        echo_wrapped(f"run saved to {run_dir}; evaluate it with: capsmed evaluate "
                     f"{shell_quoted(run_dir)}")
        return
    merged = {**base, **given}
    arguments = parse_key_values(model_arg, "--model-arg")
    if branches is not None and arguments.get("branches", branches) != branches:
        raise CapsmedError(f"--branches {branches} and --model-arg "
                           f"branches={arguments['branches']} contradict each other; drop "
                           "one")
    merged["model_kwargs"] = {**base.get("model_kwargs", {}), **arguments,
                              **({"branches": branches} if branches is not None else {})}
    run_dir = run_training(TrainConfig.from_dict(merged, origin="capsmed train"))
    echo_wrapped(f"run saved to {run_dir}; evaluate it with: capsmed evaluate "
                 f"{shell_quoted(run_dir)}")
