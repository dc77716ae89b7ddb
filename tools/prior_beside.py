"""The speed prior beside what else could tell a speed before any run, for docs/speed-prior.md (tools/speed_prior.py
writes it): llama-mdl 0.14's bytes-over-bandwidth formula, how far two machines of one spec and two builds of one
machine differ, and a measured host figure beside the datasheet's."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pandas as pd
from published_sweeps import MACHINES, PUBLISHED, published

from moeplace.plan.learned_prior import Machine, Point, errors_against

GOAL = 1.4  # the decode interval a choice between cards wants: within 40% either way
# Setups of one machine that differ in the llama.cpp build alone (a PR, a fork, a regressed build; SOURCES.md and
# HELDOUT_SOURCES.md say so): how far the build moves decode.
BUILD_PAIRS = (
    ("gptoss20b-mxfp4-rtx4080-mainline-n0", "gptoss20b-mxfp4-rtx4080-iklcpp-n0"),
    ("gptoss20b-mxfp4-rtx4080-iklcpp-cpumoe-main", "gptoss20b-mxfp4-rtx4080-iklcpp-cpumoe-pr841"),
    ("gptoss120b-f16-rtx4090-server-mainline", "gptoss120b-f16-rtx4090-server-iklcpp"),
    ("qwen36-35b-a3b-udq4km-rtxa1000-mainline", "qwen36-35b-a3b-udq4km-rtxa1000-ik4706"),
    ("qwen36-35b-a3b-udq4km-rtxa1000-ik4706", "qwen36-35b-a3b-udq4km-rtxa1000-ik4749"),
    ("qwen3-30b-a3b-iq4xs-rtx4080-mainline-hybrid14", "qwen3-30b-a3b-iq4xs-rtx4080-iklcpp-hybrid14"),
    ("qwen35-35b-a3b-q4km-rtx5060ti-b8125", "qwen35-35b-a3b-q4km-rtx5060ti-iksm120"),
    ("qwen3-30b-a3b-iq4kr4-rtx4080-iklcpp-cpumoe-24c010b3", "qwen3-30b-a3b-iq4kr4-rtx4080-iklcpp-cpumoe-f6d5fbdc"),
    ("gptoss120b-mxfp4-gb10-forum-b7486", "gptoss120b-mxfp4-gb10-forum-pr17906"),
)
# The pairs of BUILD_PAIRS that are mainline llama.cpp (first) against ik_llama.cpp (second).
FORK_PAIRS = (
    ("gptoss20b-mxfp4-rtx4080-mainline-n0", "gptoss20b-mxfp4-rtx4080-iklcpp-n0"),
    ("gptoss120b-f16-rtx4090-server-mainline", "gptoss120b-f16-rtx4090-server-iklcpp"),
    ("qwen36-35b-a3b-udq4km-rtxa1000-mainline", "qwen36-35b-a3b-udq4km-rtxa1000-ik4706"),
    ("qwen3-30b-a3b-iq4xs-rtx4080-mainline-hybrid14", "qwen3-30b-a3b-iq4xs-rtx4080-iklcpp-hybrid14"),
    ("qwen35-35b-a3b-q4km-rtx5060ti-b8125", "qwen35-35b-a3b-q4km-rtx5060ti-iksm120"),
)
# llama-mdl 0.14's decode before `mdl fit hw` (mdl_fit/perf.py: seeds, decode_time): the card's datasheet bandwidth
# x 0.70, host RAM at 32 GB/s whatever the user's, 0.3 ms per host layer, 1.5 ms per token; its per-type
# efficiencies (model.TYPE_EFF_*) are taken as 1 here, as moeplace's byte counts carry no types.
PEER = {"card_share": 0.70, "host_gbps": 32.0, "hop_s": 0.3e-3 / 2, "fixed_s": 1.5e-3}


def peer_seconds(x: dict[str, float], m: Machine) -> float:
    """llama-mdl 0.14's seconds per decoded token for the features `x` on machine `m` (see PEER)."""
    card = PEER["card_share"] * m.card_gbps
    return (
        (x["device_gb"] + x["kv_gb"]) / card
        + x["host_gb"] / PEER["host_gbps"]
        + x["hops"] * PEER["hop_s"]
        + PEER["fixed_s"]
    )


def median_pct(errors: list[float] | np.ndarray) -> float:
    return 100 * math.expm1(float(np.median(np.abs(errors))))


def decode_pairs_apart(t: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """|log| of the decode speed ratio of each pair of setups that differ in nothing the prior sees: the pairs of one
    machine's runs (one source's setups on one CPU), and the pairs of two machines."""
    t = t[t.test == "tg"]
    t = t.assign(card=t.gpu.str.split(" (", regex=False).str[0], machine=t.source_id + " " + t.cpu.fillna(""))
    alike = ["card", "host_gbps", "model", "quant", "backend", "type_k", "n_cpu_moe", "n_depth"]
    same, across = [], []
    for _, g in t.groupby(alike):
        setups = g.groupby("setup").agg(speed=("tok_s", "median"), machine=("machine", "first"))
        for a, b in itertools.combinations(setups.itertuples(), 2):
            (same if a.machine == b.machine else across).append(abs(math.log(a.speed / b.speed)))
    return np.array(same), np.array(across)


def gap_lines(tg_heldout: list[tuple[Point, float]]) -> list[str]:
    """How far the held-out decode points are from the prediction, beside how far apart published machines of one
    spec run (the part no prior can remove)."""
    within = np.mean(np.abs([e for _, e in tg_heldout]) <= math.log(GOAL))
    same, across = decode_pairs_apart(pd.concat([published(), published("heldout.csv")], ignore_index=True))
    lines = ["", f"{100 * within:.0f}% of the held-out decode points are within x/÷{GOAL} of the prediction."]
    if len(same):
        lines += [
            f"Of {len(same)} pairs of one machine's published setups alike in all the prior sees",
            "(card, host RAM, model, quant, backend, KV type, placement, depth) and differing in what it does",
            f"not (threads, build, flags, power limit), {100 * np.mean(same > math.log(GOAL)):.0f}% differ by more "
            f"than x{GOAL}.",
        ]
    if len(across):
        lines += [
            f"Of {len(across)} pairs of two machines of one spec, the median is "
            f"x{math.exp(np.median(across)):.3f} apart and the widest x{math.exp(across.max()):.3f}: the floor",
            "no prior can go below is small; most of the decode interval is the prior's own error.",
        ]
    return lines


def build_lines() -> list[str]:
    """The build as a stated drift: decode of BUILD_PAIRS' matching points (same placement, depth), and the fork
    (ik_llama.cpp against mainline llama.cpp, FORK_PAIRS) as a signed drift."""
    t = pd.concat([pd.read_csv(PUBLISHED / f) for f in ("sweeps.csv", "heldout.csv")], ignore_index=True)
    t = t[t.test == "tg"].assign(n_depth=t.n_depth.fillna(0)).groupby(["setup", "n_cpu_moe", "n_depth"]).tok_s.median()

    def ratios(pairs: tuple[tuple[str, str], ...]) -> np.ndarray:
        """log(b / a) of each pair's matching points."""
        both = [pd.concat([t[a], t[b]], axis=1, join="inner") for a, b in pairs]
        return np.array([math.log(y / x) for pair in both for x, y in pair.itertuples(index=False)])

    r, fork = np.abs(ratios(BUILD_PAIRS)), ratios(FORK_PAIRS)
    source = pd.concat([pd.read_csv(PUBLISHED / f) for f in ("sweeps.csv", "heldout.csv")]).groupby("setup").source_id
    machines = len({MACHINES.get(s, s) for s in source.first()[[a for a, _ in FORK_PAIRS]]})
    return [
        "",
        f"The build is a stated drift, not a term: {len(BUILD_PAIRS)} pairs of one machine's setups differ in the",
        f"llama.cpp build alone (a PR, a fork, a regressed build; {len(r)} matching decode points). Their decode",
        f"differs by x{math.exp(np.median(r)):.2f} in the median and up to x{math.exp(r.max()):.2f}. Of them, "
        f"{len(FORK_PAIRS)} pairs on {machines} machines are ik_llama.cpp",
        f"against mainline ({len(fork)} points): the fork decodes x{math.exp(np.median(fork)):.2f} as fast in the "
        f"median (x{math.exp(fork.min()):.2f} to x{math.exp(fork.max()):.2f}),",
        "in the same direction on "
        f"{int(np.sum(np.sign(fork) == np.sign(np.median(fork))))} of {len(fork)} points. No source gives enough "
        "builds of one machine to learn a drift per",
        "build number, and a user's build is not an input the prior reads; the interval takes it in.",
    ]


def peer_lines(left_out: list[tuple[Point, float]], tg_heldout: list[tuple[Point, float]]) -> list[str]:
    """moeplace's decode before any run beside llama-mdl 0.14's (PEER) on the same points."""
    lines = [
        "",
        "## Beside llama-mdl 0.14 (the closest peer planner: decode as bytes over bandwidth)",
        "",
        "llama-mdl's decode before `mdl fit hw`: the card's datasheet bandwidth x 0.70, host RAM at its 32 GB/s",
        "seed, 0.3 ms per host layer, 1.5 ms per token (its per-type efficiencies taken as 1). Same points, same",
        "byte counts.",
        "",
        "| points | moeplace median | llama-mdl median | moeplace closer |",
        "|---|---|---|---|",
    ]
    for what, pairs in (("held-out sweeps (heldout.csv)", tg_heldout), ("each source left out (sweeps.csv)", left_out)):
        ours = np.abs([e for _, e in pairs])
        peer = np.abs([-math.log(q.tok_s * peer_seconds(q.x, q.machine)) for q, _ in pairs])
        lines.append(
            f"| {what}, {len(ours)} | {median_pct(ours):.1f}% | {median_pct(peer):.1f}% | "
            f"{100 * np.mean(ours < peer):.0f}% of points |"
        )
    return lines


def measured_lines(prior: dict, tg_heldout: list[tuple[Point, float]], measured: list[Point]) -> list[str]:
    """The setups whose source gives both a datasheet and a measured host figure: decode from each."""
    if not measured:
        return []
    by_measured = {q.setup: [] for q in measured if q.test == "tg"}
    for q, e in errors_against(prior, [q for q in measured if q.test == "tg"]):
        by_measured[q.setup].append(e)
    lines = [
        "",
        "## A measured host figure beside the datasheet's (setups whose source gives both)",
        "",
        "| setup | host figure | median error, datasheet (--bw-ddr) | median error, measured (--bw-ddr-measured) |",
        "|---|---|---|---|",
    ]
    for setup, errors in sorted(by_measured.items()):
        sheet = [e for q, e in tg_heldout if q.setup == setup]
        host = next(q.machine.host_gbps for q in measured if q.setup == setup)
        lines.append(
            f"| {setup} | {host:g} GB/s measured | {100 * math.expm1(np.median(sheet)):+.0f}% | "
            f"{100 * math.expm1(np.median(errors)):+.0f}% |"
        )
    better, n = measured_not_worse(prior, tg_heldout, measured)
    scan = {}
    for c in np.round(np.arange(0.5, 1.51, 0.05), 2):  # a diagnostic on held-out points, never fitted
        tests = prior | {"tg": dataclasses.replace(prior["tg"], coef=prior["tg"].coef | {"host_measured": float(c)})}
        scan[float(c)] = measured_not_worse(tests, tg_heldout, measured)[0]
    best = max(scan.values())
    sources = sorted({q.source for q in measured})
    lines += [
        "",
        f"The measured figure is no worse on {better} of {n} setups. These {n} setups are {len(sources)} machine"
        f"{'s' if len(sources) > 1 else ''} ({', '.join(sources)}),",
        "whose setups differ in what the prior does not see (threads, model), and their datasheet errors spread both "
        "ways: no",
        f"coefficient of the measured host term from {min(scan):g} to {max(scan):g} makes the measured figure no worse "
        f"on all of them (at best {best} of {n},",
        f"at {', '.join(f'{c:g}' for c, k in scan.items() if k == best)}; a scan of the held-out points, not used). "
        "No learned setup gives a measured figure the fit",
        "could learn a conversion from (the one in sweeps.csv that gives one, an RTX 2080's '~102 GB/s', is kept as a "
        "datasheet",
        "setup), so the measured term stays 1: a measured read rate is what a read gets.",
    ]
    return lines


def measured_not_worse(prior: dict, tg_heldout: list[tuple[Point, float]], measured: list[Point]) -> tuple[int, int]:
    """Of the setups that give both host figures, how many the measured one predicts no worse (median |error|)."""
    setups = sorted({q.setup for q in measured if q.test == "tg"})
    errors = errors_against(prior, [q for q in measured if q.test == "tg"])
    better = sum(
        abs(np.median([e for q, e in errors if q.setup == s]))
        <= abs(np.median([e for q, e in tg_heldout if q.setup == s]))
        for s in setups
    )
    return better, len(setups)
