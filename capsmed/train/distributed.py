"""Multi-GPU training under ``torchrun``: one process per device, rank 0 writes.

``torchrun --nproc-per-node N -m capsmed train ...`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; :func:`setup` then joins the process group (NCCL on CUDA, gloo on
CPU). Every rank draws the same global batch from the same seeded sampler and trains
on its share ``batch[rank::world]``; DistributedDataParallel averages the gradients,
each rank's loss weighted by its share's size (shares of a batch that does not split
evenly differ by one sample; one can be empty), so a run on N devices follows the
single-device run with the same global batch.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from capsmed.errors import CapsmedError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Distributed:
    """This process's place in the job (world 1, rank 0 without torchrun).

    ``launched``: started by torchrun. Then the process group is joined and the model
    wrapped in DDP even for one process, so ``--nproc-per-node 1`` runs the same
    collective code path (NCCL on a GPU) as several.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    launched: bool = False

    @property
    def enabled(self) -> bool:
        return self.world > 1 or self.launched

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, index: torch.Tensor) -> torch.Tensor:
        """This rank's share of a global batch."""
        return index[self.rank::self.world] if self.enabled else index

    def positions(self, size: int) -> tuple[int, torch.Tensor] | None:
        """Where this rank's share sits in a global batch of ``size``: ``(size, rows)``
        for the random draws made per sample (augmentation), None on one process."""
        if self.world == 1:
            return None
        return size, torch.arange(self.rank, size, self.world)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks (in place; a no-op on one process)."""
        if self.enabled:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def max(self, values: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values

    def broadcast_text(self, text: str) -> str:
        """Rank 0's string on every rank (e.g. the run directory)."""
        if not self.enabled:
            return text
        box = [text]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_buffers(self, module: torch.nn.Module) -> None:
        """Rank 0's buffers (BatchNorm's running statistics) on every rank, in place.
        DDP sends them at the start of each training forward only, so after an epoch's
        last step each rank holds the statistics of its own share: validated with
        those, each rank's part of the validation loss would be another model's than
        the checkpoint rank 0 writes."""
        if self.enabled:
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def setup(device_name: str) -> tuple[Distributed, str]:
    """Join the torchrun process group if there is one; returns it and the device to use."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:  # not under torchrun
        return Distributed(), device_name
    world = int(os.environ["WORLD_SIZE"])
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if use_cuda:
        if local >= torch.cuda.device_count():
            raise CapsmedError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} "
                               "GPU(s); lower --nproc-per-node")
        torch.cuda.set_device(local)
        device_name = f"cuda:{local}"
    elif device_name == "auto":
        device_name = "cpu"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    log.info("rank %d of %d on %s", rank, world, device_name)
    return Distributed(rank, world, local, launched=True), device_name


def teardown(ctx: Distributed) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
