"""The streaming-metric base under every accumulating metric: declared states, ``reset`` and the sync
across DDP ranks (a real two-process gloo group: each rank measures half of a data set, and after
``sync`` both hold what one process measuring all of it holds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gloo_workers import metrics_worker, run_two_ranks, streaming_metrics, sync_contract_worker

from upzoo.errors import ConfigError
from upzoo.metrics import StreamingMetric


def _close(ours, reference) -> bool:
    if isinstance(reference, dict):
        return ours.keys() == reference.keys() and all(_close(ours[k], reference[k]) for k in reference)
    if isinstance(reference, (list, tuple, np.ndarray)):
        return len(ours) == len(reference) and all(_close(a, b) for a, b in zip(ours, reference))
    if isinstance(reference, str):
        return ours == reference
    return (math.isnan(ours) and math.isnan(reference)) or ours == pytest.approx(reference, rel=1e-9, abs=1e-12)


@pytest.mark.slow
def test_every_streaming_metric_synced_over_two_gloo_ranks_equals_one_process_over_all_data():
    results = run_two_ranks(metrics_worker)
    whole = {name: metric.compute() for name, metric in streaming_metrics(None).items() if name != "swd"}
    halves = [streaming_metrics(rank)["swd"] for rank in (0, 1)]  # SWD's patch positions follow each rank's
    halves[0].real_descriptors += halves[1].real_descriptors  # own image count: its reference is the
    halves[0].generated_descriptors += halves[1].generated_descriptors  # ranks' descriptors in rank order
    whole["swd"] = halves[0].compute()
    assert whole["quality"]["images"] == 24 and whole["kid_fd"]["kid_std"] > 0
    for rank in (0, 1):
        for name, reference in whole.items():
            assert _close(results[rank][name], reference), (rank, name, results[rank][name], reference)
    one_half = streaming_metrics(0)["confusion"].compute()["miou"]
    assert one_half != pytest.approx(whole["confusion"]["miou"])  # the sync is what made them equal


def test_compute_syncs_and_restores_and_a_second_sync_adds_nothing_over_two_gloo_ranks():
    """torchmetrics' contract: a synced result from ``compute`` alone, the local states after it, a
    second ``sync`` that does not double the counts, ``update`` on a synced metric refused."""
    results = run_two_ranks(sync_contract_worker)
    synced = run_two_ranks(metrics_worker)  # sync() then compute(), as the evaluation loop calls them
    for rank in (0, 1):
        local = {name: metric.compute() for name, metric in streaming_metrics(rank).items()}
        for name, row in results[rank].items():
            assert _close(row["auto"], synced[rank][name]), (rank, name)
            assert _close(row["twice"], synced[rank][name]) and row["synced"] is True, (rank, name)
            assert _close(row["in_context"], synced[rank][name]), (rank, name)
            for key in ("local", "local_after_compute", "local_after_unsync", "local_after_context"):
                assert _close(row[key], local[name]), (rank, name, key)
            assert row["update_error"].startswith(f"ConfigError: {type(streaming_metrics(0)[name]).__name__}.update()")
            assert "on a synced metric would add this rank's batch to every rank's totals" in row["update_error"]
    assert results[0]["confusion"]["auto"]["miou"] != pytest.approx(results[0]["confusion"]["local"]["miou"])


@pytest.mark.parametrize(
    "name", ["confusion", "boundary_iou", "boundary_f", "surface", "quality", "spectrum", "swd", "kid_fd"]
)
def test_reset_returns_every_metric_to_a_fresh_one(name):
    used = streaming_metrics(0)
    for metric in used.values():
        metric.reset()
    again, fresh = streaming_metrics(1, used)[name], streaming_metrics(1)[name]
    assert _close(again.compute(), fresh.compute())
    assert not _close(again.compute(), streaming_metrics(None)[name].compute())  # not what all data gives


def test_reset_clears_the_states_without_sharing_them_with_the_defaults():
    metric = streaming_metrics(0)["confusion"]
    assert metric.state_names == ("matrix",) and int(metric.matrix.sum()) > 0
    metric.reset()
    assert int(metric.matrix.sum()) == 0
    metric.matrix += 1
    metric.reset()
    assert int(metric.matrix.sum()) == 0
    quality = streaming_metrics(0)["quality"]
    quality.reset()
    assert quality.compute()["images"] == 0 and math.isnan(quality.compute()["psnr"])


def test_a_spectrum_reset_measures_another_size():
    spectrum = streaming_metrics(0)["spectrum"]
    spectrum.reset()
    spectrum.update(torch.rand(2, 3, 16, 16))
    assert spectrum.compute().shape == (12,) and int(spectrum.count) == 6  # 2 images of 3 channels


def test_the_old_all_reduce_name_still_syncs_with_a_warning():
    metric = streaming_metrics(0)["confusion"]
    before = metric.matrix.clone()
    with pytest.warns(FutureWarning, match=r"ConfusionMatrix.all_reduce\(\) is deprecated; call sync\(\)"):
        metric.all_reduce()
    assert torch.equal(metric.matrix, before)  # one process: nothing to add


@pytest.mark.parametrize(
    ("default", "reduction", "message"),
    [
        (torch.zeros(2), "mean", "reduction must be 'sum' or 'cat', got 'mean'"),
        (torch.zeros(2), "cat", "a 'cat' state starts as an empty list; pass default=None"),
        ([0, 0], "sum", "default must be a tensor or None, got list"),
    ],
)
def test_a_state_is_declared_with_a_reduction_that_fits_it(default, reduction, message):
    with pytest.raises(ConfigError, match=message):
        StreamingMetric().add_state("x", default, reduction)
