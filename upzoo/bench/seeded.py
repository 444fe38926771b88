"""``bench compare``: upsamplers trained side by side with several seeds, so that a difference can
be told from seed noise — planned (:mod:`.plan`: one cell per variant x seed), launched
(:mod:`.launchers`: in this process, a local pool of workers, or a Slurm array) and collected
(:mod:`.collect`: statistics over the seeds, paired differences, speed). The statistics never depend
on how the cells were run. The tables and chart: :mod:`.report`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from upzoo.bench.collect import collect_comparison
from upzoo.bench.launchers import launch_local
from upzoo.bench.plan import plan_comparison, write_plan
from upzoo.bench.variants import Variant

__all__ = ["compare_upsamplers"]


def compare_upsamplers(
    recipe: Any,
    variants: Sequence[Variant],
    out_dir: str | Path,
    *,
    seeds: int = 3,
    baseline: int = 0,
    launch: Callable[[Any], list] | None = None,
    device: str = "cpu",
    amp: str = "none",
    rounds: int = 10,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Plan the cells into ``out_dir``, run them with ``launch(plan)`` (default: one after another in
    this process) and collect them: ``(rows, missing)`` (see :func:`~upzoo.bench.collect.collect_comparison`)."""
    plan = plan_comparison(recipe, variants, out_dir, seeds=seeds, baseline=baseline)
    write_plan(plan, out_dir)
    (launch or launch_local)(plan)
    return collect_comparison(out_dir, device=device, amp=amp, rounds=rounds)
