"""Statistics over seeds: the mean, standard deviation and 95 % t-interval of a metric, and the
paired difference of two variants trained with the same seeds (beyond the seed noise when its
interval excludes 0)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["seed_interval", "paired_difference", "seeds_to_resolve"]


def _t975(n: int) -> float:
    """The 97.5 % quantile of Student's t with ``n - 1`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def seed_interval(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std and the 95 % confidence interval of the mean (Student's t) of per-seed values.

    >>> r = seed_interval([0.5, 0.6, 0.7])
    >>> round(r["mean"], 3), round(r["std"], 3), round(r["ci_low"], 3), round(r["ci_high"], 3)
    (0.6, 0.1, 0.352, 0.848)
    """
    finite = [float(v) for v in values if v is not None and not math.isnan(v)]  # NaN: undefined, left out
    if not finite or any(math.isinf(v) for v in finite):  # e.g. HD95 of a seed that missed a class
        mean = math.inf if finite else math.nan
        return {"mean": mean, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    mean = statistics.fmean(finite)
    if len(finite) < 2:
        return {"mean": mean, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    std = statistics.stdev(finite)
    half = _t975(len(finite)) * std / math.sqrt(len(finite))
    return {"mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def paired_difference(values: Sequence[float], baseline: Sequence[float]) -> dict[str, Any]:
    """The per-seed difference ``values - baseline`` (same seeds): its mean, 95 % interval and
    whether the interval excludes 0 (the difference is outside the seed noise)."""
    diffs = [a - b for a, b in zip(values, baseline) if math.isfinite(a) and math.isfinite(b)]
    interval = seed_interval(diffs)
    outside = len(diffs) > 1 and (interval["ci_low"] > 0 or interval["ci_high"] < 0)
    return {
        "diff": interval["mean"],
        "diff_low": interval["ci_low"],
        "diff_high": interval["ci_high"],
        "beyond": outside,
    }


def seeds_to_resolve(spread: float, difference: float, *, most: int = 1000) -> int | None:
    """The fewest seeds whose paired 95 % interval is narrower than ``difference`` on each side, when
    the per-seed differences spread by ``spread`` (their sample std): the smallest ``n >= 2`` with
    ``t(0.975, n - 1) * spread / sqrt(n) < difference``. ``None`` beyond ``most``. What a comparison
    needs before "no block separates" means more than "too few seeds".

    >>> seeds_to_resolve(0.036, 0.02), seeds_to_resolve(0.0125, 0.02)
    (15, 4)
    """
    if not (spread >= 0 and difference > 0):
        raise ValueError(f"seeds_to_resolve: spread >= 0 and difference > 0 expected, got {spread!r}, {difference!r}")
    for n in range(2, most + 1):
        if _t975(n) * spread / math.sqrt(n) < difference:
            return n
    return None
