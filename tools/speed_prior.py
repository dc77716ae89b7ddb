"""Learn the speed model's uncalibrated prior from the published sweeps (tools/published/sweeps.csv) and write
it to src/moeplace/plan/learned_prior.json, with the points it learned from (published_points.json, which
`moeplace prior learn` pools with a user's published directories and learns from the same way) and
docs/speed-prior.md: how well it predicts sources it did not learn from (each source, one machine, left out in
turn), and the held-out sweeps of heldout.csv (never learned from).

python tools/speed_prior.py          # rewrite both
python tools/speed_prior.py --check  # exit 1 if either is out of date (a test runs this)
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from moeplace.plan.learned_prior import (
    PER_BACKEND,
    POOL,
    PRIOR_FILE,
    Learned,
    Point,
    errors_against,
    held_out_errors,
    source_of,
    to_json,
)
from moeplace.plan.prior_learn import POINTS_FILE, about, learn_prior, points_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from generated import write_or_check  # noqa: E402  (docs/generated.py: write a generated file, or --check it)
from prior_beside import (  # noqa: E402  (tools/, beside this file)
    build_lines,
    gap_lines,
    measured_lines,
    measured_not_worse,
    median_pct,
    peer_lines,
    peer_seconds,
)
from published_sweeps import prior_points, published, twins  # noqa: E402  (tools/, beside this file)
from ratio_band import ratio_lines  # noqa: E402  (tools/, beside this file)

OUT = ROOT / "docs/speed-prior.md"


def bounds(pairs: list[tuple[Point, float]], learned: Learned, q: str) -> np.ndarray:
    """Each point's ~90% (q="90") or ~95% interval bound on |log error|: its backend's (Learned.log_q)."""
    return np.array([learned.log_q(p.machine.backend, q) for p, _ in pairs])


def summary(pairs: list[tuple[Point, float]], learned: Learned) -> str:
    """Median |error|, p90, the share inside each point's ~90% and ~95% intervals, and those intervals' factors (the
    median over the points: each backend has its own)."""
    e = np.abs([e for _, e in pairs])
    pct = 100 * np.expm1(e)
    b90, b95 = bounds(pairs, learned, "90"), bounds(pairs, learned, "95")
    return (
        f"{len(e)} | {np.median(pct):.1f}% | {np.percentile(pct, 90):.1f}% | {100 * np.mean(e <= b90):.0f}% | "
        f"{100 * np.mean(e <= b95):.0f}% | x{math.exp(np.median(b90)):.2f} | x{math.exp(np.median(b95)):.2f}"
    )


def host_class(p: Point) -> str:
    """The share of a decoded token's weight bytes read from host RAM: none, some (under half), most."""
    share = p.x["host_gb"] / (p.x["host_gb"] + p.x["device_gb"])
    return "none" if share == 0 else "some" if share < 0.5 else "most"


def interval_lines(prior: dict, held_out: dict, heldout_errors: dict) -> list[str]:
    """The interval per backend (each backend's left-out errors' quantiles), and by host share beside it (what the
    interval would be per class of host share, from the same left-out errors: a diagnostic, not used)."""
    lines = [
        "",
        "## The interval: per backend, from each source left out",
        "",
        "A setup's interval is its backend's: the 90% and 95% quantiles of the |log error| of that backend's points",
        "when their machine was left out (a backend of fewer than 20 such points or 2 machines takes the pooled one).",
        "A backend learned from few machines is known less well when one of them is out: SYCL's hybrid sweeps are one",
        "machine's (moearc), ROCm's card share is four machines' that disagree (an R9700 against RX 9070 XTs on HIP),",
        "while CUDA's is seventeen machines'. Held-out points are scored against their backend's interval (none of",
        "them is SYCL or Vulkan). This is the interval `predict`/`recommend` give before any run.",
        "",
        "| test | backend | left-out points (machines) | ~90% factor | ~95% factor | left-out inside ~90% "
        "| held-out points | held-out inside ~90% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for test, learned in prior.items():
        for b in sorted({p.machine.backend for p, _ in held_out[test]}):
            lo = [(p, e) for p, e in held_out[test] if p.machine.backend == b]
            he = [(p, e) for p, e in heldout_errors[test] if p.machine.backend == b]
            q90, q95 = learned.log_q(b, "90"), learned.log_q(b, "95")
            inside = f"{100 * np.mean(np.abs([e for _, e in he]) <= q90):.0f}%" if he else "-"
            lines.append(
                f"| {test} | {b} | {len(lo)} ({len({source_of(p) for p, _ in lo})}) | x{math.exp(q90):.2f} | "
                f"x{math.exp(q95):.2f} | {100 * np.mean(np.abs([e for _, e in lo]) <= q90):.0f}% | {len(he)} | "
                f"{inside} |"
            )
    lines += [
        "",
        "By the share of decode's weight bytes read from host RAM instead (each class's ~90% factor the 90% quantile",
        "of its left-out points' |log error|), the classes spread about as far apart as the backends do, and the",
        "class that holds most held-out points (some bytes from the host) is the widest either way. Both ways were",
        "scored on the held-out sweeps; the backend's is the one used.",
        "",
        "| decode bytes from host | left-out points | ~90% factor | held-out points | held-out inside it |",
        "|---|---|---|---|---|",
    ]
    for c in ("none", "some", "most"):
        lo = np.abs([e for p, e in held_out["tg"] if host_class(p) == c])
        he = np.abs([e for p, e in heldout_errors["tg"] if host_class(p) == c])
        q90 = float(np.quantile(lo, 0.9))
        lines.append(f"| {c} | {len(lo)} | x{math.exp(q90):.2f} | {len(he)} | {100 * np.mean(he <= q90):.0f}% |")
    return lines


POOL_GRID = (0.0, 0.25, 0.5, 1.0, 2.0)


def pool_lines(points: list[Point], held_out: dict[str, list[tuple[Point, float]]]) -> list[str]:
    """Each source left out at each pull of the per-backend term toward the backends' centre: how POOL was chosen
    (`held_out`: learn_prior's left-out errors, at POOL's pull)."""
    lines = [
        "",
        "## Pooling the per-backend term",
        "",
        "A backend's own coefficient (decode's card share, prefill's compute) is pulled toward the backends' centre",
        "with the weight below (0: each backend on its own). The pull is the one with the lowest median error with",
        "each source left out, so that median flatters it a little: it is the score the pull was chosen on. The",
        "held-out sweeps did not choose it, and were looked at too while it was tried: their decode median is 19.1%",
        "without the pull and 19.8% with it. Pulled, SYCL's card share is no longer set by one Arc Pro B70 alone when",
        "moearc's Arc B580 is left out. The centre is a robust middle of the backends, near their geometric mean,",
        "which a backend no published sweep used gets.",
        "",
        "| test | pull | left-out median error | left-out ~90% factor |",
        "|---|---|---|---|",
    ]
    for test, chosen in POOL.items():
        for pool in POOL_GRID:
            pairs = held_out[test] if pool == chosen else held_out_errors(test, points, pool=pool)
            e = np.abs([e for _, e in pairs])
            used = " (used)" if pool == chosen else ""
            lines.append(f"| {test} | {pool:g}{used} | {median_pct(e):.1f}% | x{math.exp(np.quantile(e, 0.9)):.2f} |")
    return lines


def tail_lines(held_out: list[tuple[Point, float]]) -> list[str]:
    """The setups most of whose decode points lie beyond the pooled left-out ~90% factor: what makes the tail."""
    q = float(np.quantile(np.abs([e for _, e in held_out]), 0.9))
    beyond: dict[tuple[str, str], list[float]] = {}
    for p, e in held_out:
        beyond.setdefault((p.setup, p.machine.backend), []).append(e)
    worst = sorted(beyond.items(), key=lambda kv: -sum(abs(e) > q for e in kv[1]))[:6]
    return [
        "",
        f"Each source left out, {sum(abs(e) > q for _, e in held_out)} decode points lie beyond x{math.exp(q):.2f}; "
        "these setups hold most of them:",
        "",
        "| setup | backend | points beyond | of | median error |",
        "|---|---|---|---|---|",
        *(
            f"| {s} | {b} | {sum(abs(x) > q for x in e)} | {len(e)} | {100 * math.expm1(np.median(e)):+.0f}% |"
            for (s, b), e in worst
        ),
        "",
        "Why, as far as the sources say: moearc's Arc B580 is SYCL's one hybrid machine, so left out SYCL's card",
        "share is one other machine's (an Arc Pro B70, every expert on the card) pulled toward the other backends',",
        "and moearc's own gpt-oss-120b decode at one placement is 29.6 tok/s at 16 threads and 15.0 at the default",
        "(x1.97), which the prior does not see; the RTX 4080 SUPER's sweep is not",
        "monotonic in N (its lab log reads one point at 24.0, 25.2 and 30.0 tok/s in three sessions); the Arc Pro",
        "B70's quantized KV cache on Vulkan slows decode at depth many times more than its bytes say (no other",
        "learned source runs a quantized cache at depth on Vulkan); ROCm's card share is four machines' that",
        "disagree (an R9700 decodes much faster per byte than the RX 9070 XTs on HIP), so each left out",
        "is priced by the other. None of these is a term another source could teach the prior; they stay in the data.",
    ]


def bar_lines(prior: dict, held_out: dict, heldout_errors: dict, measured: list[Point]) -> list[str]:
    """Issue 55's bars, each with the number that meets it or does not."""
    tg, loso = np.abs([e for _, e in heldout_errors["tg"]]), np.abs([e for _, e in held_out["tg"]])
    q90_tg = bounds(heldout_errors["tg"], prior["tg"], "90")
    inside, half = float(np.mean(tg <= q90_tg)), float(np.median(q90_tg))
    loso_factor = math.exp(float(np.quantile(loso, 0.90)))
    per = [math.exp(q["90"]) for q in prior["tg"].log_q_by_backend.values()]
    peer = np.abs([-math.log(q.tok_s * peer_seconds(q.x, q.machine)) for q, _ in heldout_errors["tg"]])
    better, n = measured_not_worse(prior, heldout_errors["tg"], measured)
    bars = [
        (
            "held-out decode closer than llama-mdl 0.14 on most points",
            f"{100 * np.mean(tg < peer):.0f}%",
            np.mean(tg < peer) > 0.5,
        ),
        (
            "held-out decode median closer than llama-mdl's",
            f"{median_pct(tg):.1f}% vs {median_pct(peer):.1f}%",
            median_pct(tg) < median_pct(peer),
        ),
        ("held-out decode median <= 20%", f"{median_pct(tg):.1f}%", median_pct(tg) <= 20),
        ("held-out decode inside the ~90% interval: 80-97%", f"{100 * inside:.0f}%", 0.8 <= inside <= 0.97),
        (
            "its half-width <= 40% (the median over the held-out points)",
            f"+{100 * math.expm1(half):.0f}% / -{100 * -math.expm1(-half):.0f}%",
            math.expm1(half) <= 0.4,
        ),
        (
            "held-out prefill median <= 35%",
            f"{median_pct([e for _, e in heldout_errors['pp']]):.1f}%",
            median_pct([e for _, e in heldout_errors["pp"]]) <= 35,
        ),
        ("each source left out: decode median <= 25%", f"{median_pct(loso):.1f}%", median_pct(loso) <= 25),
        (
            "each source left out: decode ~90% factor <= x1.5",
            f"x{loso_factor:.2f} (per backend x{min(per):.2f} to x{max(per):.2f})",
            loso_factor <= 1.5,
        ),
        ("a measured host figure never worse than the datasheet's", f"no worse on {better} of {n} setups", better == n),
    ]
    return [
        "",
        "## Issue 55's bars",
        "",
        "| bar | number | met |",
        "|---|---|---|",
        *(f"| {bar} | {number} | {'met' if met else 'not met'} |" for bar, number, met in bars),
    ]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        metas = twins(Path(tmp))
        points = prior_points(published(), metas)
        heldout = prior_points(published("heldout.csv"), metas)
        measured = prior_points(published("heldout.csv", host="measured"), metas)
    prior, held_out = learn_prior(points)  # the costly part: a fit per source left out
    sources = {t: len({source_of(p) for p in points if p.test == t}) for t in prior}
    setups = {t: len({p.setup for p in points if p.test == t}) for t in prior}
    learned = about(points, ["tools/published/sweeps.csv"]) | {"written_by": "tools/speed_prior.py"}
    lines = [
        "# The speed prior: what moeplace predicts before any run, and how far off it is",
        "",
        "Generated by `python tools/speed_prior.py` from `tools/published/` (sources in `SOURCES.md`); the",
        "terms it learns are in `src/moeplace/plan/learned_prior.json`, and `moeplace recommend`/`predict` use them",
        "when no calibration is given (the method: `src/moeplace/plan/learned_prior.py`).",
        "",
        "## How sweeps from many machines are pooled",
        "",
        "The shipped prior is learned from the points of `tools/published/` (stored, features and all, in",
        "`src/moeplace/plan/published_points.json`). `moeplace prior learn publish/A publish/B ... -o prior.json` adds",
        "the runs of moeplace publish/ directories (their `llama-bench.sqlite`, card from llama-bench's `gpu_info`,",
        "host RAM from MANIFEST.json's `machine` section or `--bw-ddr`/`--bw-ddr-measured`; a model from the file the",
        "run read, or `--model NAME=PATH` to a .gguf or twin spec) and learns the same terms the same way: each setup",
        "weighs as one, each directory is one source, and the interval is each source left out in turn.",
        "`moeplace recommend/predict/tune --prior prior.json` plan with it. A host figure is a datasheet's",
        "(`--bw-ddr`) or measured (`--bw-ddr-measured`, or what `--vram auto` measures): the learned host share",
        "discounts the first, not the second.",
        "",
        "Errors are of log(predicted / measured), shown as percent; an interval is predicted x/÷ its factor.",
        "",
        "| test | points | median error | p90 | inside ~90% | inside ~95% | ~90% factor (median) "
        "| ~95% factor (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    heldout_errors = {t: errors_against(prior, [q for q in heldout if q.test == t]) for t in prior}
    for test, p in prior.items():
        lines.append(f"| {test}, each of {sources[test]} sources ({setups[test]} setups) left out | "
                     f"{summary(held_out[test], p)} |")  # fmt: skip
        if heldout_errors[test]:
            n = len({q.setup for q, _ in heldout_errors[test]})
            lines.append(f"| {test}, held-out sweeps ({n} setups, heldout.csv) | {summary(heldout_errors[test], p)} |")
    lines += gap_lines(heldout_errors["tg"]) + build_lines()
    lines += ratio_lines(prior, points, held_out, heldout_errors)
    lines += peer_lines(held_out["tg"], heldout_errors["tg"])
    lines += measured_lines(prior, heldout_errors["tg"], measured)
    lines += interval_lines(prior, held_out, heldout_errors) + tail_lines(held_out["tg"]) + pool_lines(points, held_out)
    lines += bar_lines(prior, held_out, heldout_errors, measured)
    tables = {
        "Each source left out (learned without its machine's setups)": held_out,
        "The held-out sweeps (heldout.csv; HELDOUT_SOURCES.md)": heldout_errors,
    }
    for title, errors_by_test in tables.items():
        lines += ["", f"## {title}", "", "| test | setup | backend | points | median error |", "|---|---|---|---|---|"]
        for test, pairs in errors_by_test.items():
            by_setup: dict[str, list[float]] = {}
            backend = {}
            for q, e in pairs:
                by_setup.setdefault(q.setup, []).append(e)
                backend[q.setup] = q.machine.backend
            for setup, e in sorted(by_setup.items()):
                median = 100 * math.expm1(np.median(e))
                lines.append(f"| {test} | {setup} | {backend[setup]} | {len(e)} | {median:+.0f}% |")
    lines += ["", "## The terms learned", ""]
    for test, p in prior.items():
        each = f"{PER_BACKEND[test]} " + ", ".join(f"{b} {v:g}" for b, v in p.per_backend.items())
        lines.append(f"- {test}: {', '.join(f'{k} {v:g}' for k, v in p.coef.items())}; per backend: {each}")
    status = write_or_check(PRIOR_FILE, to_json(prior, learned), "plan/learned_prior.json", "speed_prior.py")
    status = status or write_or_check(POINTS_FILE, points_json(points), "published_points.json", "speed_prior.py")
    return status or write_or_check(OUT, "\n".join(lines) + "\n", "docs/speed-prior.md", "speed_prior.py")


if __name__ == "__main__":
    sys.exit(main())
