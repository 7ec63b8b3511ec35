"""Layer transfer (paper 003's AnB / BnB): parameters copied from another run."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


def transfer_parameters(model: torch.nn.Module, source: Path, prefixes: list[str],
                        freeze: bool) -> list[str]:
    """Copy the parameters whose names start with one of ``prefixes`` from the checkpoint
    in run directory ``source`` (paper 003's layer transfer), with their buffers (batch
    norms' running statistics, which the copied weights were trained with); optionally
    freeze the parameters, and the batch norms' statistics with them.

    Raises:
        CapsmedError: if a prefix matches nothing or shapes differ.
    """
    from safetensors.torch import load_file

    from capsmed.train.checkpoint import WEIGHTS

    path = Path(source) / WEIGHTS
    if not path.is_file():
        raise CapsmedError(f"{path}: no checkpoint to transfer from")
    weights = load_file(str(path))
    params = dict(model.named_parameters())
    copied = []
    for prefix in prefixes:
        names = [n for n in params if n == prefix or n.startswith(prefix + ".")]
        if not names:
            tops = ", ".join(sorted({n.split(".")[0] for n in params}))
            raise CapsmedError(f"transfer layer '{prefix}' matches no parameter of the "
                               f"model (it has: {tops})")
        for name in names:
            if name not in weights or weights[name].shape != params[name].shape:
                raise CapsmedError(f"{path}: parameter '{name}' is missing or has another "
                                   "shape; transfer between the same architecture and input")
            with torch.no_grad():
                params[name].copy_(weights[name])
            params[name].requires_grad_(not freeze)
            copied.append(name)
        for name, buffer in model.named_buffers():  # batch norms' running statistics
            if (name == prefix or name.startswith(prefix + ".")) and name in weights \
                    and weights[name].shape == buffer.shape:
                with torch.no_grad():
                    buffer.copy_(weights[name])
    if freeze:
        _freeze_norm_statistics(model, prefixes)
    log.info("transferred %d parameter tensors from %s%s", len(copied), source,
             " (frozen)" if freeze else "")
    return copied


def _keep_eval(module: torch.nn.Module, _inputs: object) -> None:
    module.training = False  # model.train() would set it again: undone before each call


def _freeze_norm_statistics(model: torch.nn.Module, prefixes: list[str]) -> None:
    """Batch norms inside frozen layers normalise with their transferred running
    statistics and never update them, whatever ``model.train()`` says: in training mode
    they would normalise by each batch and drift, and the frozen layers would compute
    something other than what was transferred."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and any(
                name == p or name.startswith(p + ".") for p in prefixes):
            module.eval()
            module.register_forward_pre_hook(_keep_eval)
