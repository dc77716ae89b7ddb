"""The statistics of repeated measurements: confidence intervals of a mean and of a difference (Welch),
and the smallest difference a comparison could have detected."""

from __future__ import annotations

import math
import statistics

from scipy import stats

LEVEL = 0.95
POWER = 0.8


def mean_halfwidth(samples: list[float], level: float = LEVEL) -> float:
    """Half-width of the mean's t confidence interval, relative to the mean (inf with fewer than 2 samples)."""
    n = len(samples)
    mean = statistics.fmean(samples) if samples else 0.0
    if n < 2 or mean == 0:
        return math.inf
    return float(stats.t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(samples) / math.sqrt(n) / abs(mean)


def repetitions_for(samples: list[float], precision: float, level: float = LEVEL) -> int:
    """How many samples in all would bring the relative half-width to `precision` at this spread."""
    n = len(samples)
    if n < 2:
        return 3
    mean, sd = statistics.fmean(samples), statistics.stdev(samples)
    if sd == 0:
        return n
    t = float(stats.t.ppf(0.5 + level / 2, n - 1))
    return max(n, math.ceil((t * sd / (precision * abs(mean))) ** 2))


def welch(samples: list[float], baseline: list[float]) -> tuple[float, float, float]:
    """(mean difference, its standard error, Welch's degrees of freedom); NaN spread with <2 of either."""
    delta = statistics.fmean(samples) - statistics.fmean(baseline)
    if len(samples) < 2 or len(baseline) < 2:
        return delta, math.nan, math.nan
    va, vb = statistics.variance(samples) / len(samples), statistics.variance(baseline) / len(baseline)
    se = math.sqrt(va + vb)
    if se == 0:
        return delta, 0.0, math.inf
    dof = (va + vb) ** 2 / (va**2 / (len(samples) - 1) + vb**2 / (len(baseline) - 1))
    return delta, se, dof


def delta_interval(samples: list[float], baseline: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean difference (samples - baseline) with its Welch t confidence interval; NaN bounds with <2 samples."""
    delta, se, dof = welch(samples, baseline)
    if math.isnan(se):
        return delta, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * se if se else 0.0
    return delta, delta - half, delta + half


def min_detectable_effect(
    samples: list[float], baseline: list[float], level: float = LEVEL, power: float = POWER
) -> float:
    """The smallest true difference a two-sided Welch test at `level` detects with `power`, at this noise,
    relative to the baseline's mean (NaN with <2 samples of either)."""
    _, se, dof = welch(samples, baseline)
    if math.isnan(se) or not baseline:
        return math.nan
    t = float(stats.t.ppf(0.5 + level / 2, dof)) + float(stats.t.ppf(power, dof))
    return t * se / abs(statistics.fmean(baseline))
