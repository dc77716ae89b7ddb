"""The ratio band for docs/speed-prior.md (tools/speed_prior.py writes it): how far a predicted ratio between two
placements of one machine lies from the measured one, with each machine's source left out, and how often the
placement predicted fastest in a published sweep is the one measured fastest."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from moeplace.plan.learned_prior import (
    Learned,
    Point,
    RatioPair,
    held_out_errors,
    ratio_pairs,
    source_of,
    top_picks,
)
from moeplace.plan.speed import RATIO_EDGES, ratio_class

Errors = dict[str, list[tuple[Point, float]]]


def pct(log_error: float) -> str:
    return f"{100 * math.expm1(log_error):.1f}%"


def quantiles(pairs: list[RatioPair]) -> str:
    """Pairs (sweeps) | median | ~90% | ~95% of |error| of their predicted ratios, as table cells."""
    if not pairs:
        return "0 | - | - | -"
    e = np.abs([r.error for r in pairs])
    sweeps = len({(source_of(r.first), r.first.family or r.first.setup) for r in pairs})
    return f"{len(e)} ({sweeps}) | " + " | ".join(pct(float(np.quantile(e, q))) for q in (0.5, 0.9, 0.95))


def absolute(errors: list[tuple[Point, float]]) -> str:
    e = np.abs([e for _, e in errors])
    return f"{pct(float(np.median(e)))}, x{math.exp(float(np.quantile(e, 0.9))):.2f}"


def class_label(c: int) -> str:
    edges = (0.0, *RATIO_EDGES, math.inf)
    low, high = (f"x{math.exp(edges[i]):.2f}" for i in (c, c + 1))
    return f"x1.00 to {high}" if c == 0 else f"beyond {low}" if c == len(RATIO_EDGES) else f"{low} to {high}"


def one_depth(pairs: list[RatioPair], keep: Callable[[RatioPair], bool] = lambda r: True) -> list[RatioPair]:
    return [r for r in pairs if r.at_one_depth and keep(r)]


def ratio_lines(prior: dict[str, Learned], points: list[Point], held_out: Errors, heldout: Errors) -> list[str]:
    """The ratio band beside the absolute one, per class of predicted ratio, by what differs, per machine, and the
    optimiser's top pick against the measured fastest."""
    left_out = {t: ratio_pairs(e) for t, e in held_out.items()}
    by_family = {t: ratio_pairs(held_out_errors(t, points, by="family")) for t in held_out}
    new = {t: ratio_pairs(e) for t, e in heldout.items()}
    lines = [
        "",
        "## The ratio band: two placements of one machine",
        "",
        "What `recommend --placement optimal` weighs is a ratio: is this placement faster than that one on this",
        "machine, and by how much. Most of a prediction's error is its machine's own offset (host, threads, driver),",
        "shared by the machine's placements, so it cancels in a ratio; what is left is the band below. A pair is two",
        "points of one sweep of one machine: one source, one family of setups (a setup less its -kv…/-ub… suffix:",
        "the runs that differ only in what a user chooses), one test and size; each point's error is from terms",
        "learned without its source (every setup of that machine), so a pair's error, log(predicted ratio / measured",
        "ratio), is the difference of two left-out errors. The band shipped (`log_q_ratio` in learned_prior.json, and",
        "what `prior learn` learns) is of the pairs at one depth, what a ranking compares at one context; pairs across",
        "depths are scored below too. 'Each family left out' leaves out only the machine's setups of that model (its",
        "other models stay in); 'held-out sweeps' are pairs of heldout.csv, predicted by the shipped prior. Each pair",
        "counts as one, so a family's pairs grow as the square of its points: the R9700s' sweeps (cicero-home-ai, 6",
        "placements x 3 ubatches x 2 models x 2 backends) hold most of them.",
        "",
        "| test | scored | pairs (families) | median error | ~90% | ~95% "
        "| absolute, same points: median, ~90% factor |",
        "|---|---|---|---|---|---|---|",
    ]
    for test in held_out:
        rows = (
            ("each source left out (shipped)", one_depth(left_out[test]), held_out[test]),
            ("each family left out", one_depth(by_family[test]), held_out_errors(test, points, by="family")),
            ("held-out sweeps", one_depth(new.get(test, [])), heldout.get(test, [])),
        )
        for what, pairs, errors in rows:
            lines.append(f"| {test} | {what} | {quantiles(pairs)} | {absolute(errors) if errors else '-'} |")
    lines += [
        "",
        "The larger the predicted ratio, the further off it is (the model's shape between placements is",
        "right in the median, not at the tails), so the band is learned per class of predicted ratio; a ranking",
        "calls two placements equivalent when the ~90% band of their predicted ratio holds x1, and names a gain with",
        "it. Held-out sweeps inside the shipped ~90% band of their class:",
        "",
        "| test | predicted ratio | pairs | median | ~90% (shipped) | ~95% | held-out pairs | held-out inside ~90% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for test, learned in prior.items():
        for c in range(len(RATIO_EDGES) + 1):
            mine = one_depth(left_out[test], lambda r: ratio_class(r.predicted) == c)
            theirs = np.abs([r.error for r in one_depth(new.get(test, []), lambda r: ratio_class(r.predicted) == c)])
            bound = learned.log_q_ratio["90"][c]
            inside = f"{100 * np.mean(theirs <= bound):.0f}%" if len(theirs) else "-"
            q = learned.log_q_ratio
            lines.append(
                f"| {test} | {class_label(c)} | {len(mine)} | {pct(q['50'][c])} | x/÷{math.exp(bound):.2f} | "
                f"x/÷{math.exp(q['95'][c]):.2f} | {len(theirs)} | {inside} |"
            )
    lines += [
        "",
        "By what differs between the two (n: the placement, --n-cpu-moe; kv: the cache type), each source left out",
        "and held-out:",
        "",
        "| test | differs in | pairs (families) | median | ~90% | ~95% "
        "| held-out pairs (families) | median | ~90% | ~95% |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for test in held_out:
        kinds = sorted({r.differs_in for r in left_out[test] + new.get(test, [])})
        for kind in kinds:
            mine = [r for r in left_out[test] if r.differs_in == kind]
            theirs = [r for r in new.get(test, []) if r.differs_in == kind]
            lines.append(f"| {test} | {kind} | {quantiles(mine)} | {quantiles(theirs)} |")
    lines += [
        "",
        "No published sweep compares two KV cache types at one depth past 0, where their bytes differ (at depth 0",
        "the prior and the runs alike find them equal), nor an -ot placement against --n-cpu-moe on one machine, nor",
        "a whole-layer -ngl split against either. A change of KV type at depth is the least tested advice the",
        "ranking gives (the Arc Pro B70's q8_0 cache on Vulkan decodes at 16K-64K x1.8-x4.2 slower than its own f16",
        "at depth 0, where the prior says x1.04-x1.15): `tune --placement optimal` measures it.",
        "",
        "Per machine (each source left out, pairs at one depth), the machines whose pairs are furthest off:",
        "",
        "| test | machine | pairs | median | ~90% |",
        "|---|---|---|---|---|",
    ]
    for test in held_out:
        by_source: dict[str, list[float]] = {}
        for r in one_depth(left_out[test]):
            by_source.setdefault(source_of(r.first), []).append(abs(r.error))
        worst = sorted(by_source.items(), key=lambda kv: -float(np.quantile(kv[1], 0.9)))[:6]
        for source, e in worst:
            lines.append(
                f"| {test} | {source} | {len(e)} | {pct(float(np.median(e)))} | {pct(float(np.quantile(e, 0.9)))} |"
            )
    return lines + pick_lines(held_out, heldout)


def pick_lines(held_out: Errors, heldout: Errors) -> list[str]:
    """How often the placement predicted fastest in a published sweep of three placements or more is the one
    measured fastest (issue 64's count), each source left out and on the held-out sweeps."""
    lines = [
        "",
        "### The top pick against the measured fastest",
        "",
        "Every published sweep of one machine at one test, size and depth with 3 placements or more that the",
        "prediction tells apart (--n-cpu-moe values, ubatches for prefill, KV types; points predicted alike, such as",
        "decode at two ubatches, count as one placement with their mean speed): is the placement predicted fastest",
        "the one measured fastest? 'Within 2%' counts a pick measured within 2% of the fastest (two runs of one",
        "setup differ by about that: above).",
        "",
        "| test | scored | sweeps | top pick fastest | within 2% | median pick / fastest | worst |",
        "|---|---|---|---|---|---|---|",
    ]
    missed = []
    for test in held_out:
        for what, errors in (("each source left out", held_out[test]), ("held-out sweeps", heldout.get(test, []))):
            picks = top_picks(errors)
            if not picks:
                continue
            share = [s for _, _, s in picks]
            lines.append(
                f"| {test} | {what} | {len(picks)} | {sum(a for _, a, _ in picks)} | "
                f"{sum(s >= 0.98 for s in share)} | x{np.median(share):.2f} | x{min(share):.2f} |"
            )
            missed += [(test, what, name, s) for name, agree, s in picks if not agree and s < 0.98]
    lines += ["", "The sweeps where the pick is more than 2% slower than the fastest:", ""]
    lines += ["| test | scored | sweep (family, test, size, depth) | pick / fastest |", "|---|---|---|---|"]
    lines += [f"| {t} | {what} | {name} | x{s:.2f} |" for t, what, name, s in missed]
    return lines
