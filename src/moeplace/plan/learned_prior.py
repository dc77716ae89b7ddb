"""The speed model before any run: its terms learned from published --n-cpu-moe sweeps of real cards.

A datasheet gives a card's and a host's bandwidth; it does not give how far below them llama.cpp reads, nor the
fixed time per token, nor how fast a card computes a prompt. Published sweeps do (tools/published/, 70-odd
setups from 25 machines: NVIDIA, AMD and Intel cards, Strix Halo and DGX Spark unified memory; a user's published
runs pooled with them by prior_learn). Per token, with the features of speed.features:

decode   t = t0 * L + a_card[backend] * V / B_card + a_host * D / B_host + h * hops + a_kv * KV / B_card
         (a_host_measured * D / B_host instead where B_host is a measured figure, not a datasheet's)
prefill  t = q_compute[backend] * A / F_card + q_link * C / B_link + q_copy * C / B_host + q_kv * KV / B_card

where B_card is the card's datasheet bandwidth, F_card its datasheet FP32 throughput (TFLOPS), B_host the host
RAM's (datasheet, or moeplace's default where a source does not say, as for a user who does not give it), B_link
the card's PCIe link, A the bytes of weights one token uses (prefill computes them all on the card: llama.cpp
copies host experts there for a large batch) and C the bytes it copies per token. A copy costs the link's time and
passes over host RAM (the weights are read from pageable RAM into a pinned staging buffer, which the DMA reads
again): published cards copy at 7-20 GB/s whether their link is PCIe 4.0 x16 or 5.0 x16, which no link term alone
explains, and the learned q_copy is about 3, a read, a write and a read.
The term that varies most between backends (the card's share, which takes in the per-layer kernel costs of a
backend) is learned per backend, pulled toward the backends' centre (POOL) so that a backend few machines teach
(SYCL: two) borrows from the others instead of taking one machine's word; the other terms are shared (a decode hop
per backend was tried and left out: docs/speed-prior.md). The fit is in log space (relative errors), robust (a
soft-L1 loss, so one odd setup does not bend the rest), and weighs each setup as one, however many points it has.

A datasheet's host figure and a measured one are different inputs: llama.cpp reads host RAM at about 60% of the
datasheet's figure, which a_host learns, while a measured figure (STREAM, moeplace's membw probe) already is what
a read gets. a_host_measured is learned from setups that give a measured figure; where none does, it is 1 (the
bytes over the measured bandwidth), never a_host, which would discount a measured figure a second time.

The interval is what held-out sources show: each source (one person's machine: all its setups) predicted by terms
learned without it; the 95% quantile of those errors (in log space) is the prior's ~95% interval, per backend where
a backend has enough left-out points (MIN_INTERVAL): a backend learned from few machines is known less well. A
setup left out alone would leak its machine through its siblings. The spread is mostly a machine's own offset (its
host, its threads, its driver), shared by its placements, so it says how far off an absolute speed may be.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from ..core.errors import MoeplaceError
from ..core.records import JsonObject
from ..model.meta import ModelMeta
from .speed import FEATURES, RATIO_EDGES, Z90, Z95, Run, SpeedModel, TestModel, features, ratio_class

PRIOR_FILE = Path(__file__).with_name("learned_prior.json")  # written by tools/speed_prior.py
TERMS = {
    "tg": ("fixed", "card", "host", "host_measured", "hops", "kv"),
    "pp": ("compute", "link", "copy", "kv"),
}
PER_BACKEND = {"tg": "card", "pp": "compute"}
# Each term's column in natural units before its coefficient: seconds if the coefficient were 1 (bandwidth
# shares), or a scale that puts every coefficient near 1 for the solver.
SCALE = {
    "fixed": 1e-4,
    "hops": 1e-5,
    "card": 1.0,
    "host": 1.0,
    "host_measured": 1.0,
    "kv": 1.0,
    "compute": 0.1,
    "link": 1.0,
    "copy": 1.0,
}
# A term no training point informs keeps this coefficient: a measured host figure is what a read gets.
UNINFORMED = {"host_measured": 1.0}
SOURCE = "learned (published sweeps)"
# A backend's own interval needs this many left-out points, from two machines at least; else the pooled one.
MIN_INTERVAL = (20, 2)
MIN_COEFFICIENT = 1e-3  # of a term scaled near 1: a thousandth of its share is no share
# How hard each backend's per-backend coefficient is pulled toward the backends' centre: the factor on the residual
# log(coefficient / centre), as a setup's residuals have a factor of one (in squares, 0.25 and 0.0625 beside one).
# Each is the lowest median error with each source left out (docs/speed-prior.md shows the scan). The centre is a
# robust middle of the backends (the soft-L1 loss takes the pulls as it takes the fit), near their geometric mean,
# which a backend no published sweep used gets (Learned.coefficients).
POOL = {"tg": 0.5, "pp": 0.25}


@dataclass(frozen=True)
class Machine:
    """What the prior needs to know of a machine: its backend, bandwidths (GB/s) and the card's FP32 TFLOPS."""

    backend: str
    card_gbps: float
    host_gbps: float
    link_gbps: float
    card_tflops: float
    host_measured: bool = False  # host_gbps measured (STREAM, membw), not a datasheet's figure

    @property
    def host_term(self) -> str:
        return "host_measured" if self.host_measured else "host"


@dataclass(frozen=True)
class Point:
    """One published measurement: its setup, machine, the speed model's features for it, and tok/s."""

    setup: str
    test: str
    machine: Machine
    x: dict[str, float]  # speed.features, plus active_gb: the weights one token uses
    tok_s: float
    source: str = ""  # whose machine: a source's setups are left out together; "" = the setup's own
    # The setups of one machine that differ only in what a user chooses (KV cache type, ubatch): the setup less
    # those; "" = the setup's own. A ratio between two placements is scored within one.
    family: str = ""
    # The run's own settings, where known: n_cpu_moe, depth, size (tokens generated or prompted), ubatch, type_k,
    # type_v. Two points are placements of one sweep when their size matches (see ratio_pairs).
    run: dict[str, int | str] = field(default_factory=dict)


def point_features(meta: ModelMeta, run: Run) -> dict[str, float]:
    """speed.features for `run`, with the bytes of weights one token uses wherever they live (active_gb)."""
    decode = features(meta, Run(run.n_cpu_moe, run.depth, "tg", 1, host_tensors=run.host_tensors))
    return features(meta, run) | {"active_gb": decode["device_gb"] + decode["host_gb"]}


def columns(test: str, x: dict[str, float], m: Machine) -> dict[str, float]:
    """Each term's value before its coefficient (see the module's formula), scaled by SCALE."""
    raw = {
        "fixed": x["layers"],
        "kv": x["kv_gb"] / m.card_gbps,
        **(
            {"card": x["device_gb"] / m.card_gbps, "host": 0.0, "host_measured": 0.0, "hops": x["hops"]}
            | {m.host_term: x["host_gb"] / m.host_gbps}
            if test == "tg"
            else {
                "compute": x["active_gb"] / m.card_tflops,
                "link": x["link_gb"] / m.link_gbps,
                "copy": x["link_gb"] / m.host_gbps,
            }
        ),
    }
    return {k: raw[k] * SCALE[k] for k in TERMS[test]}


@dataclass
class Learned:
    """One test's learned terms: a coefficient per term (the per-backend term's per backend), and the spread."""

    coef: dict[str, float]
    per_backend: dict[str, float]
    log_q95: float  # 95% quantile of held-out setups' |log(predicted / measured)|
    # The interval per backend: the 90% and 95% quantiles of its points' |log error| when their source was left out
    # (a backend learned from few machines is known less well); a backend without them takes log_q95's
    log_q_by_backend: dict[str, dict[str, float]] = field(default_factory=dict)
    # The ratio band: the 50%, 90% and 95% quantiles ("50", "90", "95") of |log(predicted ratio / measured ratio)|
    # between two placements of one machine at one depth, their source left out, per RATIO_EDGES class of the
    # predicted ratio (see ratio_band)
    log_q_ratio: dict[str, list[float]] = field(default_factory=dict)

    def log_q(self, backend: str, q: str = "95") -> float:
        """The ~90% (q="90") or ~95% interval's bound on |log(predicted / measured)| for a machine of `backend`;
        where no left-out point of it was scored, the pooled one (its ~90% as a normal spread scales)."""
        mine = self.log_q_by_backend.get(backend, {})
        return mine.get(q, self.log_q95 * (Z90 / Z95 if q == "90" else 1.0))

    def coefficients(self, test: str, backend: str) -> dict[str, float]:
        mine = self.per_backend.get(backend)
        if mine is None:  # a backend no published sweep used: the geometric mean of those that did
            mine = math.exp(sum(math.log(v) for v in self.per_backend.values()) / len(self.per_backend))
        return self.coef | {PER_BACKEND[test]: mine}

    def seconds(self, test: str, x: dict[str, float], m: Machine) -> float:
        c = self.coefficients(test, m.backend)
        return sum(c.get(k, UNINFORMED.get(k, 1.0)) * v for k, v in columns(test, x, m).items())


def _fit(test: str, points: list[Point], pool: float | None = None) -> Learned:
    """Log-coefficients by a robust least squares of log time per token, each setup weighing as one, PER_BACKEND's
    term per backend, pulled toward their centre with weight `pool` (POOL's by default). A term no point informs
    (a measured host figure where no source measured one) keeps its UNINFORMED coefficient."""
    pool = POOL[test] if pool is None else pool
    backends = sorted({p.machine.backend for p in points})
    every = np.array([[columns(test, p.x, p.machine)[k] for k in TERMS[test]] for p in points])
    informed = [i for i, k in enumerate(TERMS[test]) if k == PER_BACKEND[test] or np.any(every[:, i] > 0)]
    terms = [TERMS[test][i] for i in informed]
    cols = every[:, informed]
    y = np.log([1 / p.tok_s for p in points])
    sizes = {s: sum(1 for p in points if p.setup == s) for s in {p.setup for p in points}}
    weight = np.array([1 / math.sqrt(sizes[p.setup]) for p in points])
    which = np.array([backends.index(p.machine.backend) for p in points])
    shared = [k for k in terms if k != PER_BACKEND[test]]

    centre = terms.index(PER_BACKEND[test])  # the per-backend term's shared slot: the backends' centre

    def coefficients(params: np.ndarray) -> np.ndarray:
        c = np.tile(np.exp(params[: len(terms)]), (len(points), 1))
        c[:, centre] = np.exp(params[len(terms) + which])
        return c

    def residuals(params: np.ndarray) -> np.ndarray:
        fit = weight * (np.log((cols * coefficients(params)).sum(axis=1)) - y)
        return np.concatenate([fit, pool * (params[len(terms) :] - params[centre])]) if pool else fit

    start = np.zeros(len(terms) + len(backends))
    # A term the data does not want drifts toward 0 along a flat valley, to a value that differs by machine; the
    # floor stops it where it no longer matters, at the same value everywhere.
    floor = np.full_like(start, math.log(MIN_COEFFICIENT))
    params = least_squares(residuals, start, bounds=(floor, np.inf), loss="soft_l1", f_scale=0.2).x
    coef = {k: float(math.exp(params[terms.index(k)])) for k in shared}
    coef |= {k: UNINFORMED.get(k, 1.0) for k in TERMS[test] if k not in terms}
    per_backend = {b: float(math.exp(params[len(terms) + i])) for i, b in enumerate(backends)}
    return Learned(coef, per_backend, 0.0)  # spreads: learn's


def learn(test: str, points: list[Point], held_out: list[tuple[Point, float]]) -> Learned:
    """The terms from all `points` of `test`, with the spreads their leave-one-source-out errors (`held_out`, from
    held_out_errors) show."""
    learned = _fit(test, [p for p in points if p.test == test])
    learned.log_q95 = float(np.quantile(np.abs([e for _, e in held_out]), 0.95))
    learned.log_q_ratio = ratio_band([r for r in ratio_pairs(held_out) if r.at_one_depth])
    for b in sorted({p.machine.backend for p, _ in held_out}):
        e = np.abs([e for p, e in held_out if p.machine.backend == b])
        if (
            len(e) < MIN_INTERVAL[0]
            or len({source_of(p) for p, _ in held_out if p.machine.backend == b}) < MIN_INTERVAL[1]
        ):
            continue  # too few to tell its own spread: the pooled one
        learned.log_q_by_backend[b] = {q: float(f"{np.quantile(e, int(q) / 100):.4g}") for q in ("90", "95")}
    return learned


@dataclass(frozen=True)
class RatioPair:
    """Two points of one sweep of one machine (one family, test and size): the ratio of their speeds as predicted
    (its log) and how far it lies from the measured one (log(predicted ratio / measured ratio), the difference of
    the two points' errors: the machine's own offset, shared by both, cancels)."""

    first: Point
    second: Point
    predicted: float
    error: float

    @property
    def at_one_depth(self) -> bool:
        """Whether the two differ in what a ranking weighs at one context (placement, KV cache type, ubatch) only."""
        return self.first.run.get("depth") == self.second.run.get("depth")

    @property
    def differs_in(self) -> str:
        """What differs between the two: n (the placement), depth, ubatch, kv (the cache type), joined with +."""
        a, b = self.first.run, self.second.run
        kv = (a.get("type_k"), a.get("type_v")) != (b.get("type_k"), b.get("type_v"))
        differ = [k for k in ("n_cpu_moe", "depth", "ubatch") if a.get(k) != b.get(k)] + (["kv"] if kv else [])
        return "+".join("n" if k == "n_cpu_moe" else k for k in differ) or "nothing (a repeat)"


def sweep_of(p: Point) -> tuple[str, str, str, object]:
    """The sweep a point belongs to: its machine, its family of setups, its test and the test's size."""
    return source_of(p), p.family or p.setup, p.test, p.run.get("size")


def ratio_pairs(errors: list[tuple[Point, float]]) -> list[RatioPair]:
    """Every pair of points of one sweep (sweep_of) with their errors (log(predicted / measured), from terms learned
    without their source, or a held-out set's): how far each predicted ratio lies from the measured one."""
    by_sweep: dict[tuple[str, str, str, object], list[tuple[Point, float]]] = {}
    for p, e in errors:
        by_sweep.setdefault(sweep_of(p), []).append((p, e))
    return [
        RatioPair(p1, p2, math.log(p1.tok_s / p2.tok_s) + e1 - e2, e1 - e2)
        for points in by_sweep.values()
        for i, (p1, e1) in enumerate(points)
        for p2, e2 in points[i + 1 :]
    ]


def ratio_band(pairs: list[RatioPair]) -> dict[str, list[float]]:
    """The 50%, 90% and 95% quantiles of |error| of `pairs`' predicted ratios, per RATIO_EDGES class of the predicted
    ratio (a class no pair falls in takes all the pairs')."""
    every = np.abs([r.error for r in pairs])
    band: dict[str, list[float]] = {q: [] for q in ("50", "90", "95")}
    for c in range(len(RATIO_EDGES) + 1):
        mine = np.abs([r.error for r in pairs if ratio_class(r.predicted) == c])
        for q, values in band.items():
            values.append(float(f"{np.quantile(mine if len(mine) else every, int(q) / 100):.4g}"))
    return band


def top_picks(errors: list[tuple[Point, float]], fewest: int = 3) -> list[tuple[str, bool, float]]:
    """Each sweep (sweep_of) at one depth with `fewest` placements or more that the predictions tell apart (points
    predicted alike, such as decode at two ubatches, are one placement: their mean measured speed): its name,
    whether the placement predicted fastest is the one measured fastest, and the measured speed of the prediction's
    pick over the fastest's."""
    by_sweep: dict[tuple[object, ...], dict[float, list[float]]] = {}
    for p, e in errors:
        placements = by_sweep.setdefault((*sweep_of(p), p.run.get("depth")), {})
        placements.setdefault(round(math.log(p.tok_s) + e, 9), []).append(p.tok_s)
    picks = []
    for key, placements in sorted(by_sweep.items(), key=lambda kv: str(kv[0])):
        if len(placements) < fewest:
            continue
        measured = {predicted: float(np.mean(speeds)) for predicted, speeds in placements.items()}
        pick, fastest = measured[max(measured)], max(measured.values())
        picks.append((" ".join(str(k) for k in key[1:]), pick == fastest, pick / fastest))
    return picks


def source_of(p: Point) -> str:
    """The group a left-out score leaves out together: the point's source (machine), else its setup."""
    return p.source or p.setup


def held_out_errors(
    test: str, points: list[Point], by: str = "source", pool: float | None = None
) -> list[tuple[Point, float]]:
    """Each point's log(predicted / measured) from terms learned without its source (by="source": every setup of
    the machine it ran on), without its family alone (by="family": the machine's setups of one model that differ in
    KV cache type or ubatch; its other models stay) or without its setup alone (by="setup"); `pool` as _fit's."""
    mine = [p for p in points if p.test == test]
    groups: dict[str, Callable[[Point], str]] = {
        "source": source_of,
        "family": lambda p: p.family or p.setup,
        "setup": lambda p: p.setup,
    }
    group = groups[by]
    out = []
    for key in sorted({group(p) for p in mine}):
        learned = _fit(test, [p for p in mine if group(p) != key], pool)  # spreads unused here
        out += [(p, -math.log(p.tok_s * learned.seconds(test, p.x, p.machine))) for p in mine if group(p) == key]
    return out


def errors_against(prior: dict[str, Learned], points: list[Point]) -> list[tuple[Point, float]]:
    """log(predicted / measured) of points no term was learned from (a held-out set)."""
    return [(p, -math.log(p.tok_s * prior[p.test].seconds(p.test, p.x, p.machine))) for p in points]


def to_json(prior: dict[str, Learned], about: JsonObject) -> str:
    return json.dumps({"about": about, "tests": {t: asdict(v) for t, v in prior.items()}}, indent=1) + "\n"


def load(path: Path = PRIOR_FILE) -> dict[str, Learned]:
    """A prior as to_json wrote it: the shipped one (learned_prior.json), or a user's from moeplace prior learn."""
    try:
        data = json.loads(Path(path).read_text())
        # A prior written before the ratio band has log_q95_difference (two near placements' 95%): learn it again.
        tests = {t: {k: x for k, x in v.items() if k != "log_q95_difference"} for t, v in data["tests"].items()}
        prior = {t: Learned(**v) for t, v in tests.items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise MoeplaceError(
            f"{path}: not a moeplace speed prior ({e}); write one with moeplace prior learn DIR -o {path} (the "
            "shipped one: python tools/speed_prior.py)."
        ) from None
    if not set(prior) <= set(TERMS) or "tg" not in prior:
        raise MoeplaceError(
            f"{path}: a speed prior needs a 'tg' test (and at most 'pp'); write it with moeplace prior learn."
        )
    return prior


def speed_model(meta: ModelMeta, m: Machine, prior: dict[str, Learned] | None = None) -> SpeedModel:
    """The speed model of `meta` on machine `m` from the learned terms: speed.FEATURES' coefficients, with the
    held-out spread as each test's (its ~95% interval is the held-out setups' 95% quantile, `m`'s backend's).
    Prefill's compute is per token and the same at every placement, so it is prefill's time per layer."""
    prior = prior or load()
    tests = {}
    for test, learned in prior.items():
        c = learned.coefficients(test, m.backend)
        per_unit = {  # seconds per unit of each speed.FEATURES feature
            "layers": c.get("fixed", 0.0) * SCALE["fixed"],
            "kv_gb": c["kv"] * SCALE["kv"] / m.card_gbps,
            "device_gb": c.get("card", 0.0) * SCALE["card"] / m.card_gbps,
            "host_gb": c.get(m.host_term, UNINFORMED.get(m.host_term, 0.0)) * SCALE["host"] / m.host_gbps,
            "hops": c.get("hops", 0.0) * SCALE["hops"],
            "link_gb": c.get("link", 0.0) * SCALE["link"] / m.link_gbps
            + c.get("copy", 0.0) * SCALE["copy"] / m.host_gbps,
        }
        if test == "pp":
            active = point_features(meta, Run(0, 0, "pp", 1))["active_gb"]
            per_unit["layers"] = c["compute"] * SCALE["compute"] * active / m.card_tflops / meta.n_layer
        coef = {k: per_unit[k] for k in FEATURES[test]}
        tests[test] = TestModel(
            coef,
            dict.fromkeys(coef, SOURCE),
            spread=learned.log_q(m.backend) / Z95,
            ratio_bound=learned.log_q_ratio.get("90"),
        )
    return SpeedModel(tests)
