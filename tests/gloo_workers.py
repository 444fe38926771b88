"""Functions that torch.multiprocessing spawns in a new interpreter: each child imports this module
again, so it imports nothing from the tests (a child's ``import conftest`` would find the project's
root conftest.py first)."""

from __future__ import annotations

import torch


def collectives_worker(rank: int, port: int, results) -> None:
    """One rank of a two-process gloo group: every collective's result, in ``results[rank]``."""
    import torch.distributed as dist

    from upzoo.collectives import all_gather_floats, all_reduce_max, all_reduce_sum, collective_device
    from upzoo.train.distributed import DistContext, all_reduce_mean, any_rank, ranks_in_sync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ctx = DistContext(rank=rank, world_size=2)
        counts = torch.tensor([1, 2, 3], dtype=torch.int64) * (rank + 1)
        layer = torch.nn.Linear(2, 1)
        torch.nn.init.constant_(layer.weight, 0.5)
        torch.nn.init.zeros_(layer.bias)
        got = {
            "device": str(collective_device()),
            "sum": all_reduce_sum(counts).tolist(),
            "max": all_reduce_max(torch.tensor([float(rank), -float(rank)])).tolist(),
            "gather": all_gather_floats(10.0 + rank),
            "mean": all_reduce_mean(float(rank), ctx),
            "any": any_rank(rank == 1, ctx),
            "none": any_rank(False, ctx),
            "in_sync": ranks_in_sync({"m": layer}, ctx),
        }
        torch.nn.init.constant_(layer.weight, float(rank))  # the ranks now differ
        try:
            ranks_in_sync({"m": layer}, ctx)
        except Exception as error:  # noqa: BLE001 - the message is the result
            got["differ"] = f"{type(error).__name__}: {error}"
        results[rank] = got  # a manager's dict keeps what is assigned, not later changes inside it
    finally:
        dist.destroy_process_group()
