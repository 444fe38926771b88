"""Distributed training on PyTorch's own engine: torchrun + DistributedDataParallel (gloo on the
CPU, NCCL on CUDA). Everything here is a no-op in a single process."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sized
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from upzoo.data.loading import iterate_loader

__all__ = [
    "DistContext",
    "init_distributed",
    "finish_distributed",
    "resumable_batches",
    "ResumableSampler",
    "all_reduce_mean",
    "sync_buffers",
    "any_rank",
]


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this run created the process group and must destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group that torchrun describes in the environment (``WORLD_SIZE`` > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), owns)


def finish_distributed(ctx: DistContext) -> None:
    """Wait for every rank and tear down the process group this run created (a process that exits
    with a live gloo group can abort on its way out)."""
    if ctx.enabled and ctx.owns_group and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_mean(value: float, ctx: DistContext) -> float:
    """The mean of a float over all ranks."""
    if not ctx.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / ctx.world_size


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when it is true on any (so that all ranks stop at the same step)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def sync_buffers(module: torch.nn.Module, ctx: DistContext) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart in the last step, which DDP
    only re-broadcasts at the next forward), so evaluation and checkpoints agree across ranks."""
    if ctx.enabled:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


class ResumableSampler(Sampler[int]):
    """Deterministic per-epoch order from ``(seed, epoch)``, sharded over ranks, that can start
    part-way through an epoch (to resume exactly where a run stopped).

    Training (``shuffle=True``): a seeded permutation, padded by wrapping so every rank gets the
    same number of samples. Evaluation (``shuffle=False``): ``rank::world_size`` without padding,
    so a dataset is counted exactly once across ranks.
    """

    def __init__(self, data: Sized, *, shuffle: bool, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        self.n, self.shuffle, self.seed, self.rank, self.world = len(data), shuffle, seed, rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Order of ``epoch``; skip this rank's first ``start`` samples."""
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.rank, self.n, self.world))
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.n, generator=g).tolist()
        total = -(-self.n // self.world) * self.world
        order += order[: total - self.n]
        return order[self.rank :: self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start :])

    def __len__(self) -> int:
        return max(0, len(self._indices()) - self.start)


def resumable_batches(
    dataset: Dataset, sampler: ResumableSampler, *, start_step: int, steps_per_epoch: int, seed: int, **loader_kwargs
) -> Iterator[tuple[int, dict, bool]]:
    """Yield ``(epoch, batch, ends_epoch)`` from optimiser step ``start_step`` on, epoch after epoch.

    Each epoch's order comes from ``(seed, epoch)`` and each sample's augmentation from
    ``(seed, epoch, index)``; a resumed epoch skips the batches already trained, so a resumed run sees
    exactly the batches an uninterrupted one would. ``loader_kwargs`` go to the DataLoader
    (``batch_size`` required; ``drop_last=True`` keeps every epoch at ``steps_per_epoch`` batches).
    """
    step = start_step
    while True:
        epoch, done = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch, start=done * loader_kwargs["batch_size"])
        dataset.seed, dataset.epoch = seed, epoch  # read by the dataset's per-sample seeding
        for batch in iterate_loader(DataLoader(dataset, sampler=sampler, **loader_kwargs)):
            step += 1
            yield epoch, batch, step % steps_per_epoch == 0
