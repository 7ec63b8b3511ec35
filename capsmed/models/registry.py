"""Create models by name: ``create_model("capsnet", num_classes=2, in_channels=1)``.

Each architecture file registers small builder functions with ``@register_model``;
a builder's keyword arguments are its schema. Every builder accepts the uniform
vocabulary ``in_channels``, ``num_classes`` and ``input_size`` (H, W).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from capsmed.errors import CapsmedError

Builder = Callable[..., nn.Module]


@dataclass(frozen=True)
class ModelEntry:
    """A registered architecture: its builder and a one-line description."""

    name: str
    builder: Builder
    description: str
    paper: str

    def defaults(self) -> dict[str, Any]:
        """The builder's keyword arguments and their defaults."""
        sig = inspect.signature(self.builder)
        return {k: p.default for k, p in sig.parameters.items()
                if p.default is not inspect.Parameter.empty}


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, paper: str = "") -> Callable[[Builder], Builder]:
    """Decorator registering ``builder`` under the kebab-case ``name``."""

    def wrap(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"model '{name}' registered twice")
        doc = (inspect.getdoc(builder) or "").splitlines()
        _REGISTRY[name] = ModelEntry(name, builder, doc[0] if doc else "", paper)
        return builder

    return wrap


def list_models() -> list[ModelEntry]:
    """All registered architectures, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get_model_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        raise CapsmedError(f"unknown architecture '{name}' (choose from: "
                           f"{', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the architecture ``name``; None-valued kwargs fall back to the defaults."""
    entry = get_model_entry(name)
    # unknown names first: a misspelt option set to null is no default to fall back on
    unknown = sorted(set(kwargs) - set(inspect.signature(entry.builder).parameters))
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if unknown:
        raise CapsmedError(f"architecture '{name}' has no option(s) {', '.join(unknown)} "
                           f"(options: {', '.join(entry.defaults())})")
    return entry.builder(**kwargs)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
