"""The statistics of repeated measurements: a configuration's value (the median, with its distribution-free
interval), confidence intervals of a mean and of a difference (Welch), and the smallest difference a comparison
could have detected."""

from __future__ import annotations

import math
import statistics

LEVEL = 0.95
POWER = 0.8


# A repetition farther from the median than this many robust standard deviations (1.4826 MAD) is outlying.
OUTLIER_SDS = 3.0


def _t_quantile(q: float, dof: float) -> float:
    """Student's t distribution's quantile. scipy is imported here, not with the module: importing scipy.stats
    takes 0.7 s, which every pipeline stage would pay at its start, and most need no t quantile."""
    from scipy import stats

    return float(stats.t.ppf(q, dof))


def median_interval(samples: list[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(median, low, high): the median and its distribution-free confidence interval, the order statistics
    x(k) and x(n+1-k) with the largest k whose binomial coverage is at least `level` (as pyperf and hyperfine
    report medians). Sporadic slow repetitions move neither the median nor, past the first few, the interval.
    NaN bounds where no such pair exists (fewer than 6 samples at 95%)."""
    x = sorted(samples)
    n = len(x)
    median = statistics.median(x) if x else math.nan
    k = 0
    # P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) <= k-1)
    while k + 1 <= n // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n >= level:
        k += 1
    if k == 0:
        return median, math.nan, math.nan
    return median, x[k - 1], x[n - k]


def fewest_for_median_interval(level: float = LEVEL, spared: int = 0) -> int:
    """The fewest samples whose median has an interval at `level` that leaves out the `spared` smallest and
    largest: 6 at 95% (x(1)..x(6) covers 96.9%), 9 sparing one (x(2)..x(8) covers 96.1%)."""
    return next(n for n in range(2, 64) if median_interval(list(range(n)), level)[1] >= spared)


def median_halfwidth(samples: list[float], level: float = LEVEL) -> float:
    """Half the width of the median's interval, relative to the median (inf where it has none)."""
    median, low, high = median_interval(samples, level)
    if math.isnan(low) or median == 0:
        return math.inf
    return (high - low) / 2 / abs(median)


def outlying(samples: list[float], precision: float) -> list[float]:
    """The repetitions that disagree with the rest: farther from the median than `precision` of it and than
    OUTLIER_SDS robust standard deviations."""
    if len(samples) < 3:
        return []
    median = statistics.median(samples)
    spread = 1.4826 * statistics.median(abs(v - median) for v in samples)
    limit = max(OUTLIER_SDS * spread, precision * abs(median))
    return [v for v in samples if abs(v - median) > limit]


def repetitions_for(samples: list[float], precision: float, level: float = LEVEL) -> int:
    """How many samples in all would bring the relative half-width to `precision` at this spread."""
    n = len(samples)
    if n < 2:
        return 3
    mean, sd = statistics.fmean(samples), statistics.stdev(samples)
    if sd == 0:
        return n
    t = _t_quantile(0.5 + level / 2, n - 1)
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
    half = _t_quantile(0.5 + level / 2, dof) * se if se else 0.0
    return delta, delta - half, delta + half


def min_detectable_effect(
    samples: list[float], baseline: list[float], level: float = LEVEL, power: float = POWER
) -> float:
    """The smallest true difference a two-sided Welch test at `level` detects with `power`, at this noise,
    relative to the baseline's mean (NaN with <2 samples of either)."""
    _, se, dof = welch(samples, baseline)
    if math.isnan(se) or not baseline:
        return math.nan
    t = _t_quantile(0.5 + level / 2, dof) + _t_quantile(power, dof)
    return t * se / abs(statistics.fmean(baseline))
