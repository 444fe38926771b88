"""Distributed training on PyTorch's own engine: torchrun + DistributedDataParallel (gloo on the
CPU, NCCL on CUDA). Everything here is a no-op in a single process."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sized
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from upzoo.collectives import all_gather_floats, all_reduce_max, all_reduce_sum
from upzoo.data.loading import iterate_loader
from upzoo.errors import ConfigError, TrainingError

__all__ = [
    "DistContext",
    "distributed_environment",
    "rank_device",
    "check_nproc",
    "init_distributed",
    "finish_distributed",
    "resumable_batches",
    "ResumableSampler",
    "all_reduce_mean",
    "sync_buffers",
    "wrap_ddp",
    "ranks_in_sync",
    "any_rank",
]


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this run created the process group and must destroy it
    device: torch.device = torch.device("cpu")  # where this rank trains (cuda:LOCAL_RANK under DDP on CUDA)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, low: int, high: int | None = None) -> int | None:
    """Environment variable ``name`` as an int in ``[low, high)``, None when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value >= high):
        span = f">= {low}" if high is None else f"in [{low}, {high - 1}]"
        raise ConfigError(
            f"environment variable {name}={raw!r}: expected a whole number {span}; "
            "launch with torchrun or `upzoo train --nproc N`, which set it"
        )
    return value


def distributed_environment() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's environment, checked before any work.

    Raises:
        ConfigError: ``LOCAL_RANK`` or ``RANK`` without ``WORLD_SIZE``, or a value that is not a
            whole number in range; naming the variable.
    """
    world = _env_int("WORLD_SIZE", 1)
    if world is None:
        for name in ("LOCAL_RANK", "RANK"):
            if name in os.environ:
                raise ConfigError(
                    f"environment variable {name}={os.environ[name]!r} is set but WORLD_SIZE is not: "
                    "launch with torchrun or `upzoo train --nproc N` (they set both), or unset it"
                )
        return 0, 1, 0
    rank = _env_int("RANK", 0, world) or 0
    local_rank = _env_int("LOCAL_RANK", 0, world) or 0
    return rank, world, local_rank


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """The device of the rank with ``local_rank`` on this node: ``cuda:LOCAL_RANK`` for a CUDA run
    (selected with ``torch.cuda.set_device``), else ``device``.

    Raises:
        ConfigError: more ranks on this node than CUDA devices visible.
    """
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"DDP rank with LOCAL_RANK={local_rank} needs CUDA device {local_rank}, but only {count} are "
            "visible here: use --nproc <= the GPUs (CUDA_VISIBLE_DEVICES) or train.device: cpu"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def check_nproc(nproc: int, device: torch.device) -> None:
    """``--nproc`` processes on ``device``: on CUDA one GPU each, so no more than are visible.

    Raises:
        ConfigError: more processes than CUDA devices, with the fix.
    """
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise ConfigError(
            f"--nproc {nproc} puts one process on each GPU, but {torch.cuda.device_count()} CUDA device(s) are "
            f"visible here{shown}: lower --nproc, or set train.device: cpu for processes on the CPU"
        )


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group that torchrun describes in the environment (``WORLD_SIZE`` > 1).

    On CUDA each rank trains on ``cuda:LOCAL_RANK`` and the group is ``cpu:gloo,cuda:nccl`` (NCCL
    for the gradients, gloo for the small CPU collectives: stop flags, loss means, metric counts);
    on the CPU it is gloo. A single process gets ``DistContext(device=device)``.
    """
    rank, world, local_rank = distributed_environment()
    if world <= 1:
        return DistContext(device=device)
    device = rank_device(device, local_rank)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, owns, device)


def finish_distributed(ctx: DistContext, *, wait: bool = True) -> None:
    """Wait for every rank (``wait``; not after a failure, when the others may never come) and tear
    down the process group this run created (a process that exits with a live gloo group can abort
    on its way out)."""
    if ctx.enabled and ctx.owns_group and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_mean(value: float, ctx: DistContext) -> float:
    """The mean of a float over all ranks."""
    if not ctx.enabled:
        return value
    return float(all_reduce_sum(torch.tensor([value], dtype=torch.float64))) / ctx.world_size


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when it is true on any (so that all ranks stop at the same step)."""
    if not ctx.enabled:
        return flag
    return bool(all_reduce_max(torch.tensor([1.0 if flag else 0.0])).item())


def sync_buffers(module: torch.nn.Module, ctx: DistContext) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart in the last step, which DDP
    only re-broadcasts at the next forward), so evaluation and checkpoints agree across ranks."""
    if ctx.enabled:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


def wrap_ddp(module: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """``module`` in DistributedDataParallel under torchrun (on CUDA bound to this rank's GPU), else as it is."""
    if not ctx.enabled:
        return module
    if ctx.device.type == "cuda":
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=[ctx.device.index])
    return torch.nn.parallel.DistributedDataParallel(module)


def ranks_in_sync(modules: dict[str, torch.nn.Module], ctx: DistContext) -> bool | None:
    """Whether every rank holds exactly the same parameters (None in a single process).

    Raises:
        TrainingError: the ranks differ, with each rank's parameter sum.
    """
    if not ctx.enabled:
        return None
    total = sum(float(p.detach().double().sum()) for m in modules.values() for p in m.parameters())
    gathered = all_gather_floats(total)
    if any(g != gathered[0] for g in gathered):
        raise TrainingError(f"DDP ranks hold different parameters at the end of training: {gathered}")
    return True


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
