"""A run's model, built from its options or refused before anything is written.

``--model-arg`` values arrive as YAML scalars, so ``hidden=abc`` is a string and
``widths=[-1,5]`` a list with a negative width; a builder fed those fails deep inside
torch with a traceback, or builds a model that fails at its first step. The
builder's defaults are its schema (STYLE 2): a value must have its default's type,
sizes (tuples of integers) are positive, no weight may be empty (a single width of
0), and the model must run one sample.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn

from capsmed.errors import CapsmedError, first_line
from capsmed.models import create_model
from capsmed.models.registry import get_model_entry
from capsmed.train.choices import FROM_DATA


def check_model_kwargs(arch: str, kwargs: dict[str, Any]) -> None:
    """Refuse a model option whose value does not have its default's type.

    Raises:
        CapsmedError: ``"<arch>: model option <key>=<value> must be <what>"``.
    """
    defaults = get_model_entry(arch).defaults()
    for key, value in kwargs.items():
        if key in FROM_DATA or key not in defaults or value is None:
            continue  # unknown names are refused by create_model, with the list
        expected = _expected(defaults[key], value)
        if expected is not None:
            raise CapsmedError(f"{arch}: model option {key}={value!r} must be {expected}")


# (architectures, option, value that makes them inert, the options then without effect)
INERT = (
    (("capsnet",), "routing", "em", ("routing_eta", "grad_through_routing")),
    (("capsnet",), "routing", "none", ("routing_iters", "routing_eta",
                                        "grad_through_routing")),
    (("capsnet", "aff-capsnet"), "reconstruction", "none", ("decoder_hidden",)),
    (("em-capsnet",), "capsule_layers", 2, ("mid_types",)),
    (("parallel-dr",), "capsule_layers", 2, ("mid_caps", "mid_dim")),
    (("parallel-dr",), "capsule_layers", 3, ("mid_caps",)),
)

# (architectures, option, the largest value that makes them inert, why, the options then
# without effect): only a value other than the default is refused, so that a sweep may
# state the default at every point of its grid (pipelines/routing2019.yaml gives
# routing_eta at routing_iters 1)
INERT_UP_TO = (
    (("capsnet",), "routing_iters", 1, "uniform couplings, no agreement step",
     ("routing_eta", "grad_through_routing")),
)


def check_inert_options(arch: str, kwargs: dict[str, Any]) -> None:
    """Refuse model options the other options make inert: the run's config.yaml would
    record a setting (a kernel, an eta) the model never used.

    Raises:
        CapsmedError: ``"<arch>: <key> has no effect with <other>=<value>"``.
    """
    given = {k for k, v in kwargs.items() if v is not None and k not in FROM_DATA}
    defaults = get_model_entry(arch).defaults()
    if "kernel_size" in given and "kernel_size" in defaults:
        both = sorted(given & {"conv_kernel", "primary_kernel"})
        if both:
            raise CapsmedError(f"{arch}: kernel_size sets conv_kernel and primary_kernel; "
                               f"give either kernel_size or {' and '.join(both)}")
    for archs, option, value, inert in INERT:
        if arch in archs and kwargs.get(option, defaults.get(option)) == value:
            unused = [k for k in inert if k in given]
            if unused:
                raise CapsmedError(f"{arch}: {', '.join(unused)} ha"
                                   f"{'s' if len(unused) == 1 else 've'} no effect with "
                                   f"{option}={value}; leave {'it' if len(unused) == 1 else 'them'}"
                                   " out")
    for archs, option, most, why, inert in INERT_UP_TO:
        value = kwargs.get(option, defaults.get(option))
        if arch not in archs or not isinstance(value, int) or not 0 <= value <= most:
            continue  # (routing em / none: refused above whenever given)
        changed = [k for k in inert if k in given and kwargs[k] != defaults[k]]
        if changed:
            shown = ", ".join(f"{k}={kwargs[k]!r}" for k in changed)
            raise CapsmedError(f"{arch}: {shown} ha{'s' if len(changed) == 1 else 've'} no "
                               f"effect with {option}={value} ({why}); leave "
                               f"{'it' if len(changed) == 1 else 'them'} out or set "
                               f"{option} >= {most + 1}")


def _expected(default: Any, value: Any) -> str | None:
    """What ``value`` should be, given the default, or None when it fits."""
    if default is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) \
            else "an integer"
    if isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
        return None if ok else "a finite number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    if isinstance(default, tuple | list):
        sizes = all(isinstance(v, int) and not isinstance(v, bool) for v in default)
        what = "a list of positive integers" if sizes else "a list"
        if not isinstance(value, list | tuple):
            return f"{what} like {list(default)}"
        if sizes and not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                             for v in value):
            return f"{what} like {list(default)}"
    return None


def build_model(arch: str, kwargs: dict[str, Any], image_shape: tuple[int, int, int]
                ) -> nn.Module:
    """``create_model(arch, **kwargs)``, checked: options of the right types, a model
    that builds with no empty weight, and one sample of ``image_shape`` through it (in
    eval mode, with the global RNG untouched, so the run's seeded initialisation and
    batches are the same).

    Raises:
        CapsmedError: naming the architecture and the options when any step fails.
    """
    check_model_kwargs(arch, kwargs)
    check_inert_options(arch, kwargs)
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k not in FROM_DATA)
    try:
        with warnings.catch_warnings():  # a width of 0: refused below in one line, not
            # after torch's two-line warning on stderr
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            model = create_model(arch, **kwargs)
    except CapsmedError:
        raise
    except (TypeError, ValueError, RuntimeError, IndexError, ZeroDivisionError) as exc:
        raise CapsmedError(f"{arch} cannot be built with these options ({shown or 'none'})"
                           f": {first_line(exc)}") from None
    # a width of 0 (class_dim=0, mid_dim=0) can build a model that runs and trains,
    # its class capsules all of length 0: no architecture has an empty weight
    empty = next((name for name, p in model.named_parameters() if p.numel() == 0), None)
    if empty is not None:
        raise CapsmedError(f"{arch} cannot be built with these options ({shown or 'none'})"
                           f": its weight {empty} would hold no values (a size of 0)")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        was_training = model.training
        try:
            model.eval()(torch.zeros(1, *image_shape))
        except CapsmedError:
            raise
        except (TypeError, ValueError, RuntimeError, IndexError, ZeroDivisionError) as exc:
            raise CapsmedError(f"{arch} with these options ({shown or 'none'}) cannot "
                               f"classify {'x'.join(map(str, image_shape))} images: "
                               f"{first_line(exc)}") from None
        finally:
            model.train(was_training)
    return model
