"""Collectives across DistributedDataParallel ranks, written once for every caller (the training
loop's loss means and stop flag, the metrics' count sums), each a no-op in a single process.

A collective runs on the device the process group can reduce on: a group with a CPU backend (gloo,
or the ``cpu:gloo,cuda:nccl`` group that :func:`upzoo.train.distributed.init_distributed` creates
on CUDA) reduces CPU tensors where they are; a group that is NCCL only (one a user made) gets the
tensor on this rank's current CUDA device and the result copied back. NCCL refuses CPU tensors, so
without this a metric sync or a stop flag fails on the first GPU run.
"""

from __future__ import annotations

import torch

__all__ = [
    "distributed_active",
    "collective_device",
    "all_reduce_sum",
    "all_reduce_max",
    "all_gather_floats",
    "all_gather_objects",
]


def distributed_active() -> bool:
    """Whether this process belongs to an initialised process group of more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_device() -> torch.device:
    """Where the default group reduces: the CPU when it has a CPU backend, else this rank's GPU."""
    import torch.distributed as dist

    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _reduce(tensor: torch.Tensor, op) -> torch.Tensor:
    import torch.distributed as dist

    device = collective_device()
    if tensor.device == device:
        dist.all_reduce(tensor, op=op)
        return tensor
    moved = tensor.to(device)
    dist.all_reduce(moved, op=op)
    tensor.copy_(moved)
    return tensor


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place (on whatever device it lives); returns it."""
    if not distributed_active():
        return tensor
    import torch.distributed as dist

    return _reduce(tensor, dist.ReduceOp.SUM)


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum of ``tensor`` over all ranks, in place; returns it."""
    if not distributed_active():
        return tensor
    import torch.distributed as dist

    return _reduce(tensor, dist.ReduceOp.MAX)


def all_gather_floats(value: float) -> list[float]:
    """``value`` of every rank, in rank order (``[value]`` in a single process)."""
    if not distributed_active():
        return [value]
    import torch.distributed as dist

    device = collective_device()
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return [float(g) for g in gathered]


def all_gather_objects(value: object) -> list[object]:
    """``value`` of every rank, in rank order (``[value]`` in a single process): any picklable object,
    of any size on each rank (tensors are sent from the CPU, so NCCL groups take them too)."""
    if not distributed_active():
        return [value]
    import torch.distributed as dist

    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
