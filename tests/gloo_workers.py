"""Functions that torch.multiprocessing spawns in a new interpreter: each child imports this module
again, so it imports nothing from the tests (a child's ``import conftest`` would find the project's
root conftest.py first)."""

from __future__ import annotations

import torch


def run_two_ranks(worker, *args, timeout: float = 300.0) -> dict:
    """``worker(rank, port, results, *args)`` in two spawned processes of one gloo group on a free
    port; what each rank put in ``results``, by rank. Ranks still running after ``timeout`` seconds
    are killed and the call fails naming the hang (a collective reached by one rank only)."""
    import socket
    import time

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        context = mp.spawn(worker, args=(port, results, *args), nprocs=2, join=False)
        deadline = time.monotonic() + timeout
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the two ranks hung: still running after {timeout:.0f} s; got {dict(results)}")
        return dict(results)


def train_worker(rank: int, port: int, results, runs: dict) -> None:
    """One rank of a two-process gloo group, as torchrun starts it: trains every ``runs[name] =
    (recipe dict, run folder)`` in turn in the same group; each run's summary in ``results``."""
    import datetime
    import os

    import torch.distributed as dist

    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    timeout = datetime.timedelta(seconds=120)  # a collective that one rank never reaches fails, not hangs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timeout)
    try:
        for name, (recipe, run) in runs.items():
            summary = train(parse_recipe(recipe), run, progress=False)
            keep = ("steps", "world_size", "ranks_in_sync")
            results[f"{name}/{rank}"] = {key: summary[key] for key in keep}
    finally:
        dist.destroy_process_group()


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


def streaming_metrics(rank: int | None, metrics: dict | None = None) -> dict:
    """Every streaming metric (new ones, or ``metrics``) fed rank ``rank``'s half of one fixed data
    set (``None``: all of it), before any sync. The same data on every call, so a test can rebuild
    what each rank saw."""
    from upzoo.metrics import (
        BoundaryFScore,
        BoundaryIoU,
        ConfusionMatrix,
        FeatureDistances,
        ImageQuality,
        RadialSpectrum,
        SlicedWasserstein,
        SurfaceMetrics,
        module_features,
    )

    g = torch.Generator().manual_seed(7)
    labels = torch.randint(0, 3, (4, 2, 24, 24), generator=g)
    predictions = torch.where(torch.rand(labels.shape, generator=g) < 0.8, labels, (labels + 1) % 3)
    images = torch.rand(4, 6, 3, 32, 32, generator=g)
    other = (images + 0.1 * torch.randn(images.shape, generator=g)).clamp(0, 1)
    volumes = torch.randint(0, 3, (4, 2, 6, 8, 8), generator=g)
    torch.manual_seed(0)
    extractor = module_features(
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(1), torch.nn.LazyLinear(8))
    )
    extractor(images[0, :1])  # materialises the lazy layer with the seeded weights
    metrics = metrics or {
        "confusion": ConfusionMatrix(3),
        "boundary_iou": BoundaryIoU(3),
        "boundary_f": BoundaryFScore(3),
        "surface": SurfaceMetrics(3),
        "quality": ImageQuality(crop_border=2),
        "spectrum": RadialSpectrum(),
        "swd": SlicedWasserstein(patches_per_image=8, repeats=2, directions=16),
        "kid_fd": FeatureDistances(extractor, subsets=3, subset_size=6),
    }
    for batch in range(4) if rank is None else (2 * rank, 2 * rank + 1):
        for name in ("confusion", "boundary_iou", "boundary_f"):
            metrics[name].update(predictions[batch], labels[batch])
        metrics["surface"].update(volumes[batch], volumes[(batch + 1) % 4], (1.0, 0.5, 0.5))
        metrics["quality"].update(other[batch], images[batch])
        metrics["spectrum"].update(other[batch])
        for name in ("swd", "kid_fd"):
            metrics[name].update(images[batch], real=True)
            metrics[name].update(other[batch], real=False)
    return metrics


def metrics_worker(rank: int, port: int, results) -> None:
    """One rank of a two-process gloo group: every streaming metric's result after ``sync``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        metrics = streaming_metrics(rank)
        for metric in metrics.values():
            metric.sync()
        results[rank] = {name: metric.compute() for name, metric in metrics.items()}
    finally:
        dist.destroy_process_group()


def sync_contract_worker(rank: int, port: int, results) -> None:
    """One rank of a two-process gloo group: the torchmetrics contract of every streaming metric —
    ``compute`` syncs and restores the local states, a second ``sync`` adds nothing, ``update`` on a
    synced metric is refused, ``unsync`` and ``sync_context`` give the local states back."""
    import torch.distributed as dist

    def local(metric):
        metric.sync_on_compute = False
        try:
            return metric.compute()
        finally:
            metric.sync_on_compute = True

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        got = {}
        for name, metric in streaming_metrics(rank).items():
            row = {"local": local(metric), "auto": metric.compute()}
            row["local_after_compute"] = local(metric)
            metric.sync()
            metric.sync()  # a second sync is a no-op, never a second sum
            row["twice"], row["synced"] = metric.compute(), metric.synced
            try:
                metric.update(*([torch.zeros(1)] if name in ("spectrum",) else []))
            except Exception as error:  # noqa: BLE001 - the message is the result
                row["update_error"] = f"{type(error).__name__}: {error}"
            metric.unsync()
            row["local_after_unsync"] = local(metric)
            with metric.sync_context():
                row["in_context"] = local(metric)
            row["local_after_context"] = local(metric)
            got[name] = row
        results[rank] = got
    finally:
        dist.destroy_process_group()
