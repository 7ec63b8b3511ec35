"""One optimisation step, shared by the trainer and ``capsmed bench train``.

Speed without changing results on CPU: autocast (bf16, or fp16 with loss scaling)
only on GPUs, routing always in fp32 (``capsmed.models.capsules`` disables autocast
inside routing), channels-last on CUDA, optional ``torch.compile``, optionally the
whole step as one CUDA graph. The step returns device tensors and never calls
``.item()``, so the host does not wait for the GPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from capsmed.data.loader import TwoLabels
from capsmed.device import device_name
from capsmed.errors import CapsmedError
from capsmed.models.common import ModelOutput
from capsmed.train.augment import AugmentSpec, Transforms, apply_transforms, draw_transforms
from capsmed.train.losses import count_correct, training_loss, two_label_loss

log = logging.getLogger(__name__)


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``name`` on ``device`` (None = fp32 or tf32, no autocast)."""
    if name in ("fp32", "tf32") or (name == "auto" and device.type != "cuda"):
        return None
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def precision_mode(name: str, device: torch.device) -> str:
    """What ``--precision name`` really is on ``device``: ``fp32`` (IEEE fp32: TF32 off),
    ``tf32`` (fp32 tensors, TF32 matmuls and convolutions), ``bf16`` or ``fp16``
    (autocast; routing and the loss stay IEEE fp32). ``auto`` is resolved.

    Raises:
        CapsmedError: ``tf32`` where there is none (not CUDA, or before Ampere).
    """
    dtype = resolve_precision(name, device)
    if dtype is not None:
        return "bf16" if dtype == torch.bfloat16 else "fp16"
    if name == "tf32" and (device.type != "cuda"
                           or torch.cuda.get_device_capability(device)[0] < 8):
        raise CapsmedError(f"--precision tf32 needs a CUDA GPU of compute capability 8.0 "
                           f"or newer (Ampere); this device is {device_name(device)}")
    return name if name == "tf32" else "fp32"


# What config.yaml and the benchmark results call each mode (float32 is IEEE fp32).
PRECISION_NAMES = {"fp32": "float32", "tf32": "tf32", "bf16": "bfloat16", "fp16": "float16"}


@contextlib.contextmanager
def float32_matmuls(mode: str) -> Iterator[None]:
    """Run fp32 matmuls and convolutions as ``mode`` says: TF32 for ``tf32``, IEEE fp32
    for every other mode (PyTorch's default lets cuDNN convolutions use TF32, which made
    "fp32" figures TF32 ones). Restores the previous setting afterwards."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = mode == "tf32"
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def coupling_entropy(couplings: torch.Tensor) -> torch.Tensor:
    """Sum over samples and lower capsules of the entropy (nats) of each lower capsule's
    coupling distribution over the capsules above (paper 003's association entropy,
    before averaging), and the count of those rows, as a tensor ``[sum, rows]``."""
    c = couplings.float().flatten(0, -2)
    h = -(c * torch.log(c.clamp_min(1e-12))).sum(-1)
    return torch.stack([h.sum(), h.new_full((), float(len(h)))])  # a fill: no copy


@dataclass
class StepSettings:
    """What every step needs besides the data."""

    loss_kind: str
    recon_weight: float
    autocast_dtype: torch.dtype | None = None
    channels_last: bool = False
    class_weights: torch.Tensor | None = None
    augment: AugmentSpec | None = None
    augment_rng: torch.Generator | None = None
    decoder: nn.Module | None = None  # for the second object's reconstruction (two labels)


def prepare_model(model: nn.Module, device: torch.device, channels_last: bool,
                  compile_model: bool) -> nn.Module:
    """Move to ``device`` (channels-last if asked) and optionally compile; returns the
    module to call (the original keeps the weights to save)."""
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if compile_model:
        log.info("compiling the model (torch.compile; takes a while on the first steps)")
        return torch.compile(model)
    return model


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor | TwoLabels | None,
            settings: StepSettings, **kwargs: bool) -> ModelOutput:
    """Forward pass under the run's precision and memory format (the decoder is masked
    by ``y``, or by the first object's class for two labels)."""
    if isinstance(y, TwoLabels):
        y = y.first
    if settings.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with autocast(x.device, settings.autocast_dtype):
        return model(x, target=y, **kwargs) if y is not None else model(x, **kwargs)


def loss_and_correct(out: ModelOutput, x: torch.Tensor, y: torch.Tensor | TwoLabels,
                     settings: StepSettings, weighted: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The training loss (fp32) and the number of correct predictions of a batch."""
    if isinstance(y, TwoLabels):
        loss = two_label_loss(settings.loss_kind, out, y, settings.recon_weight,
                              settings.decoder, images=x)
    else:
        loss = training_loss(settings.loss_kind, out, x, y, settings.recon_weight,
                             settings.class_weights if weighted else None)
    return loss, count_correct(out.scores.detach(), y)


class EpochTally:
    """An epoch's running training figures, kept on the device so that no step waits for
    the host: the summed loss x samples and correct predictions (float64), and the
    global step whose loss was first not finite (-1: none yet). Updated in place, so a
    CUDA graph that captured :meth:`add` keeps updating these very tensors."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.bad_step = torch.full((), -1, dtype=torch.int64, device=device)
        self.step = torch.zeros((), dtype=torch.int64, device=device)

    def start_epoch(self, loss_sum: float, correct: float, global_step: int) -> None:
        """Start from a resumed epoch's sums (0 for a new epoch). Python numbers enter
        as kernel arguments: no host-to-device copy."""
        self.sums[0].fill_(loss_sum)
        self.sums[1].fill_(correct)
        self.bad_step.fill_(-1)
        self.step.fill_(global_step)

    def add(self, loss: torch.Tensor, correct: torch.Tensor, n: int) -> None:
        self.sums += torch.stack([loss.double() * n, correct.double()])
        self.step += 1
        self.bad_step.copy_(torch.where((self.bad_step < 0) & ~torch.isfinite(loss),
                                        self.step, self.bad_step))


class TrainStep:
    """Augment, forward, loss in fp32, backward, optimiser step.

    Args:
        model: The module to call (possibly compiled or wrapped in DDP).
        optimizer: Its optimiser.
        settings: Precision, loss and augmentation settings.
        tally: Where the training loop sums each step's loss and correct predictions
            (part of the step, so that a CUDA graph of it keeps them too).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 settings: StepSettings, tally: EpochTally | None = None) -> None:
        self.model, self.optimizer, self.settings = model, optimizer, settings
        self.tally = tally
        fp16 = settings.autocast_dtype == torch.float16
        device_type = next(model.parameters()).device.type
        self.scaler = torch.amp.GradScaler(device_type, enabled=fp16)

    def draw(self, x: torch.Tensor, share: tuple[int, torch.Tensor] | None = None
             ) -> Transforms | None:
        """The augmentation's random transforms for batch ``x`` (None: no augmentation)."""
        s = self.settings
        if s.augment is None:
            return None
        assert s.augment_rng is not None
        return draw_transforms(s.augment, x.shape, s.augment_rng, x.device, share)

    def __call__(self, x: torch.Tensor, y: torch.Tensor,
                 share: tuple[int, torch.Tensor] | None = None,
                 transforms: Transforms | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the batch loss and the number of correct predictions (device tensors).
        ``share``: where ``x`` sits in the global batch (torchrun), for augmentation.
        ``transforms``: the augmentation's draws for ``x``, made beforehand (a CUDA
        graph's step); drawn here if the run augments and none are given."""
        s = self.settings
        if s.augment is not None:
            drawn = transforms if transforms is not None else self.draw(x, share)
            if len(x):  # an empty share (torchrun) draws too: the generator stays in step
                x = apply_transforms(x, drawn)
        out = forward(self.model, x, y, s)
        loss, correct = loss_and_correct(out, x, y, s)
        objective = loss
        if share is not None:  # torchrun: weighed by this rank's share of the batch
            if len(y) == 0:  # a last batch smaller than the ranks left this one nothing:
                # it still joins the gradient average, with 0 (its mean is 0/0)
                loss = torch.nan_to_num(loss, nan=0.0)
            objective = loss * _share_weight(len(y), share)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(objective).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        loss = loss.detach()
        if self.tally is not None:
            self.tally.add(loss, correct, len(y))
        return loss, correct


def _share_weight(n: int, share: tuple[int, torch.Tensor]) -> float:
    """What this rank's mean loss over its ``n`` samples is weighted by so that the
    gradient DistributedDataParallel averages over the ranks is the mean over the
    global batch: ``n * world / size``. A global batch of a size that is not a multiple
    of the ranks gives shares one sample apart; an even average of their means would
    weigh the samples of the smaller shares more than the single process does."""
    return n * dist.get_world_size() / share[0]


class GraphedTrainStep:
    """A :class:`TrainStep` replayed as one CUDA graph: forward, loss, backward, the
    optimiser update and the step's tally become one launch, so small batches are no
    longer bound by the host issuing hundreds of kernels.

    The first ``warmup`` calls run the plain step on a side stream: real steps, which
    also initialise cuBLAS, cuDNN and the optimiser's state, as capture needs. The next
    call captures the step and every later call of that batch shape (the largest
    seen) replays it. A batch of another shape (an epoch's last, partial one) runs
    the plain step. A changed learning rate (a schedule), which the graph holds as a
    constant, is captured again. The loss and correct count returned are the graph's
    own tensors: valid until the next call. Not for fp16 (the loss scaler decides on
    the host). On-device augmentation draws its transforms eagerly before each replay
    (:meth:`TrainStep.draw`, the eager step's draws in the eager step's order) and the
    graph takes them as inputs beside the batch: a graph holding the draws themselves
    would replay the same random transforms at every step.
    """

    def __init__(self, step: TrainStep, warmup: int = 3) -> None:
        s = step.settings
        if s.autocast_dtype == torch.float16:
            raise ValueError("CUDA graphs need fp32 or bf16")
        for group in step.optimizer.param_groups:
            group["capturable"] = True  # state (the step count) lives on the device
        self.step, self.warmup = step, warmup
        self.shape: tuple[torch.Size, torch.Size] | None = None
        self.warmed = 0
        self.side: torch.cuda.Stream | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        # the batch, its labels and its augmentation draws, as the graph reads them
        self.static: tuple[torch.Tensor, torch.Tensor, Transforms | None] | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self.captured_lrs: list[float] = []

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self.step.scaler

    def _lrs(self) -> list[float]:
        return [group["lr"] for group in self.step.optimizer.param_groups]

    def __call__(self, x: torch.Tensor, y: torch.Tensor,
                 share: tuple[int, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shape is None or len(x) > self.shape[0][0]:  # graph the largest batch
            # (a run resumed before its epoch's last, partial batch starts with that)
            self.shape, self.warmed, self.graph, self.static = (x.shape, y.shape), 0, None, None
        if (x.shape, y.shape) != self.shape:
            return self.step(x, y, share)
        if self.warmed < self.warmup:
            self.warmed += 1
            return self._on_side_stream(x, y)
        transforms = self.step.draw(x)
        if self.graph is None or self.captured_lrs != self._lrs():
            self._capture(x, y, transforms)
        assert self.static is not None and self.graph is not None and self.outputs is not None
        self.static[0].copy_(x)
        self.static[1].copy_(y)
        if transforms is not None:
            assert self.static[2] is not None
            for target, value in zip(_tensors(self.static[2]), _tensors(transforms),
                                     strict=True):
                target.copy_(value)
        self.graph.replay()
        return self.outputs

    def _on_side_stream(self, x: torch.Tensor, y: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.side is None:
            self.side = torch.cuda.Stream()
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            out = self.step(x, y)
        torch.cuda.current_stream().wait_stream(self.side)
        return out

    def _capture(self, x: torch.Tensor, y: torch.Tensor,
                 transforms: Transforms | None) -> None:
        """Record the step on the static batch; nothing runs until the replay."""
        if self.static is None:
            self.static = (x.clone(), y.clone(),
                           None if transforms is None else Transforms(
                               transforms.theta.clone(),
                               tuple(t.clone() for t in transforms.hed)))
        self.graph = None  # a new learning rate: the old graph's memory goes first
        self.step.optimizer.zero_grad(set_to_none=True)  # gradients from the graph's pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs = self.run_static()
        self.graph, self.captured_lrs = graph, self._lrs()

    def run_static(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The step on the static inputs: what the graph records."""
        assert self.static is not None
        x, y, transforms = self.static
        return self.step(x, y, None, transforms)


def _tensors(transforms: Transforms) -> tuple[torch.Tensor, ...]:
    return (transforms.theta, *transforms.hed)
