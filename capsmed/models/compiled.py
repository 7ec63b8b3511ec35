"""Routing compiled into fused GPU kernels (torch.compile / Inductor), eager elsewhere.

Why: routing is a small share of a capsule network's arithmetic but, run eagerly, it
bounds the training speed on a GPU. Each iteration of the textbook loop is a chain of
separate kernels (softmax, weighted sum, squash, agreement), each reading the
[B, I, J, D] vote tensor again, and backward accumulates as many vote-sized
gradients. Compiled, an iteration becomes a couple of reductions that read the votes
once or twice, and bf16 votes are upcast in registers instead of copied to fp32 (the
same values as the eager ``.float()`` copy, so the arithmetic is still fp32).

Only CUDA tensors take the compiled path: on a CPU the eager loop is as fast and a
compile costs seconds per input shape, which tests and short CPU runs would pay.
``CAPSMED_COMPILE_ROUTING=0`` turns the compiled path off (to compare, or where no
compiler toolchain is available); a compile that fails falls back to eager with one
warning rather than stopping a run.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

ENV_SWITCH = "CAPSMED_COMPILE_ROUTING"


def routing_compile_enabled() -> bool:
    """Whether CUDA routing is compiled (``CAPSMED_COMPILE_ROUTING``, default on)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def compiled_on_cuda(fn: F) -> F:
    """Run ``fn`` compiled when its first argument is a CUDA tensor, else eagerly.

    Inside an outer ``torch.compile`` the eager function is called, so the outer
    compile traces it as part of its own graph.
    """
    compiled: Callable[..., Any] | None = None
    failed = _FAILED.setdefault(f"{fn.__module__}.{fn.__qualname__}", [False])

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        first = args[0]
        if (failed[0] or not first.is_cuda or torch.compiler.is_compiling()
                or not routing_compile_enabled()):
            return fn(*args, **kwargs)
        if compiled is None:
            raise_recompile_limit(RECOMPILE_LIMIT)
            compiled = torch.compile(fn, fullgraph=True)
        try:
            return compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # no toolchain, too many shapes: slower, never stopped
            failed[0] = True
            log.warning("compiled %s failed (%s: %s); routing runs eagerly from now on "
                        "(slower). Set %s=0 to skip the attempt.", fn.__name__,
                        type(exc).__name__, str(exc).splitlines()[0][:200], ENV_SWITCH)
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


RECOMPILE_LIMIT = 64

# Per compiled function: whether its compile failed (it then routes eagerly, with one
# warning). A study worker resets them before each command (reset_compile_failures):
# a failure in one run must not make the later runs of the worker route eagerly, other
# weights than a fresh capsmed train makes, without a word in their logs.
_FAILED: dict[str, list[bool]] = {}


def reset_compile_failures() -> None:
    """Let every compiled function try compiling again (and warn again if it fails)."""
    for state in _FAILED.values():
        state[0] = False


def raise_recompile_limit(limit: int) -> None:
    """Allow at least ``limit`` compiled variants per function (dynamo's default: 8;
    past it, a function silently runs eagerly).

    Each combination of grad mode (training / evaluation), autocast dtype, couplings
    returned or not, and layer shape is a variant; an analysis that loads several
    models in one process, or a model with several routed layers, passes 8 quickly,
    and so does a study worker that trains many models one after another.
    """
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))
