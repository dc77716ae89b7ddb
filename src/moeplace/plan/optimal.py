"""`recommend --placement optimal`: every placement that fits a request at one context, for each KV cache type and
ubatch worth trying, ranked by the speed model. Each is planned for the request as given (flash attention, slots,
the tool's logits, the backend's copy of host experts, a projector, -nkvo, the user's pins) and checked by the same
budget as the plain plan (memory.device_need), so no line it prints is one the plain plan would refuse.

What the speed model knows best on one machine is a ratio: whether one placement is faster than another, and by
how much (the ratio band, docs/speed-prior.md). The ranking calls equivalent what that band cannot separate, and
the advice (advise) names another placement only where the band separates it from the user's own."""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from ..core.config import Device
from ..model.draft import draft_need
from ..model.memory import Pins, Workload, device_need
from ..model.meta import ModelMeta
from ..runtime.llamacpp_args import refusal
from .budget import NOTHING_BESIDE, Beside, plan
from .layer_split import largest_ngl, predict_ngl
from .offload import optimal_placement
from .request import Request
from .speed import Run, host_layer_bytes, prefill_up_to


@dataclass(frozen=True)
class OnDevice:
    """The model on one device as every placement shares it: the backend that runs it, the bytes beside the model
    (a vision projector's file), the user's -ot pins, a speculative draft beside it and a unified-memory pool."""

    meta: ModelMeta
    device: Device
    backend: str
    extra_bytes: int = 0
    pins: Pins = Pins()
    beside: Beside = NOTHING_BESIDE

    def main(self, w: Workload) -> Workload:
        """The main context's workload (as drafting changes it)."""
        return self.beside.spec.main(self.meta, w) if self.beside.spec else w

    def draft_bytes(self, w: Workload) -> int:
        """The draft's device buffers beside a main context of workload `w` (0: no draft)."""
        return draft_need(self.beside.spec, self.meta, w, 0).total if self.beside.spec else 0


@dataclass(frozen=True)
class Setting:
    """What the optimiser may change beside the placement: the KV cache type and the ubatch."""

    type_k: str
    type_v: str
    ubatch: int


def settings(request: Request) -> list[Setting]:
    """The request's own KV cache and ubatch first (it wins ties), then q8_0 and ubatches 512 and 2048, where
    llama.cpp runs them (a quantized V cache needs flash attention)."""
    kv_types = dict.fromkeys([(request.type_k, request.type_v), ("q8_0", "q8_0")])
    ubatches = dict.fromkeys([request.ubatch, 512, 2048])
    return [
        Setting(k, v, u) for (k, v), u in itertools.product(kv_types, ubatches) if not refusal(request.flash_attn, v)
    ]


def objective_score(objective: str, tg: dict[str, float] | None, pp: dict[str, float] | None) -> float | None:
    """What a placement is ranked by: decode or prefill tok/s, or for mix:W the tokens per second of a workload
    spending the share W of its tokens in decode and the rest in prefill (None: the model cannot say)."""
    if objective == "decode":
        return None if tg is None else tg["tok_s"]
    if objective == "prefill":
        return None if pp is None else pp["tok_s"]
    weight = float(objective.split(":", 1)[1])
    if not tg or not pp:
        return None
    return 1 / (weight / tg["tok_s"] + (1 - weight) / pp["tok_s"])


def fits(on: OnDevice, request: Request, ctx: int, host: frozenset[str]) -> bool:
    """Whether this host set fits the device for the request at `ctx`, by the plain plan's own budget."""
    w = request.workload(ctx, on.backend)
    need = device_need(on.meta, on.main(w), 0, None, on.extra_bytes, Pins(host=host))
    return need.total + on.draft_bytes(w) + on.device.kept_free <= on.device.vram_bytes


class RankedPlacement(TypedDict, total=False):
    """One placement --placement optimal ranks (recommend adds its -ot value and llama-server line)."""

    placement: str  # ncmoe (--n-cpu-moe), optimal (-ot of the knapsack's tensors) or ngl (a whole-layer split)
    type_k: str
    type_v: str
    ubatch: int
    tg: dict[str, float] | None  # decode tok/s with its ~95% interval (tok_s, low, high)
    pp: dict[str, float] | None
    score: float | None  # by the request's objective; higher is better
    n_cpu_moe: int | None
    n_gpu_layers: int
    host_tensors: list[str]  # the whole host set, the user's pins included
    equivalent: bool  # the ratio band of its predicted ratio to the best holds x1: not known to be slower
    override_tensor: str | None
    command: str


def rank_placements(
    on: OnDevice, request: Request, ctx: int, model: Any, choices: list[Setting] | None = None
) -> list[RankedPlacement]:
    """Every placement that fits at `ctx` for each of `choices` (default settings(request)): --n-cpu-moe at the
    budget's minimum, and where they differ from it the knapsack's -ot placements (the most expert bytes on the
    device, prefill's best, and the same less the hops the model prices, decode's best), each checked by the plain
    plan's budget, the user's pins kept in each, with the speed model's decode and prefill at that depth, best first
    by the request's objective (ties in the order given: the user's KV cache type and ubatch, --n-cpu-moe before -ot).
    A placement whose predicted ratio to the best is within the ratio band (SpeedModel.ratio_bound) is `equivalent`
    to it: which is faster is not known. `host_tensors` is each placement's whole host set, pins included. Where
    experts go to the host and the user pins none, the largest whole-layer split that fits (-ngl, `n_gpu_layers`) is
    ranked beside them by its decode (layer_split)."""

    meta, pins = on.meta, on.pins
    order: list[RankedPlacement] = []  # as given
    hop_bytes = host_layer_bytes(meta, model)
    for s in choices or settings(request):
        asked = request.with_(type_k=s.type_k, type_v=s.type_v, ubatch=s.ubatch)
        p = plan(meta, on.device, asked.workload(ctx, on.backend), None, on.extra_bytes, pins, on.beside)
        if p["n_cpu_moe"] is None:
            continue
        candidates = [("ncmoe", p["n_cpu_moe"], pins.host_set(meta, p["n_cpu_moe"]))]
        for cost in dict.fromkeys([0.0, hop_bytes]):
            host = frozenset(optimal_placement(meta, p["budget_bytes"], cost, pins))
            if all(host != c[2] for c in candidates) and fits(on, asked, ctx, host):
                candidates.append(("optimal", 0, host))
        for name, n, host in candidates:
            tg = model.predict(meta, Run(0, ctx, "tg", 128, s.ubatch, s.type_k, s.type_v, host))
            pp = model.predict(meta, prefill_up_to(0, ctx, s.ubatch, s.type_k, s.type_v, host))
            order.append(_row(name, s, tg, pp, request.ranked_by) | {"n_cpu_moe": n, "host_tensors": sorted(host)})
        if p["n_cpu_moe"] and not pins.rules:  # some experts on the host: whole layers there instead
            order += _layer_split(on, asked, ctx, model, s)
    ranked = sorted(order, key=lambda r: -(r["score"] or 0.0))  # stable: ties keep the order given
    best = ranked[0]["score"] if ranked else None
    for r in ranked:
        score = r["score"]
        r["equivalent"] = best is not None and score is not None and not separated(model, request, best, score)
    return ranked


OBJECTIVE_TESTS = {"decode": ("tg",), "prefill": ("pp",)}  # mix:W weighs both


def band(model: Any, request: Request, ratio: float) -> float:
    """The ~90% bound on log(measured / predicted) of a predicted `ratio` between two placements' scores: the ratio
    band of a ratio that size, the wider of decode's and prefill's for a mix."""
    tests = OBJECTIVE_TESTS.get(request.ranked_by, ("tg", "pp"))
    return max(float(model.ratio_bound(t, math.log(ratio))) for t in tests)


def separated(model: Any, request: Request, faster: float, slower: float) -> bool:
    """Whether a placement scored `faster` is known to be faster than one scored `slower`: the ratio band of their
    predicted ratio does not reach x1."""
    ratio = faster / slower
    return math.log(ratio) > band(model, request, ratio)


@dataclass(frozen=True)
class Gain:
    """A placement's predicted speed over the user's own for the objective, with its ~90% ratio band."""

    ratio: float
    low: float
    high: float


class AdviceJson(TypedDict):
    """An Advice as a plan's JSON carries it: rows by their index in the plan's placements."""

    use: int
    yours: int
    gain: dict[str, float] | None  # ratio, low, high
    costs: list[str]
    contenders: list[int]
    fastest: dict[str, float] | None  # the fastest predicted placement's ratio to yours, low, high


@dataclass
class Advice:
    """What --placement optimal advises at one context: the line to use (the user's own unless another placement
    that fits is predicted faster beyond the ratio band), its gain over the user's own, what it costs beyond speed,
    and the contenders: the placements the band cannot tell from the best, which tune measures."""

    use: RankedPlacement
    yours: RankedPlacement
    gain: Gain | None  # of `use` over `yours`; None where `use` is yours
    costs: list[str] = field(default_factory=list)  # sentences
    contenders: list[RankedPlacement] = field(default_factory=list)
    fastest: Gain | None = None  # the fastest predicted placement over yours, with its band: separated or not

    def as_json(self, ranked: list[RankedPlacement]) -> AdviceJson:
        """This advice with its rows as their index in `ranked` (the list it was given)."""
        index = {id(r): i for i, r in enumerate(ranked)}
        return {
            "use": index[id(self.use)],
            "yours": index[id(self.yours)],
            "gain": asdict(self.gain) if self.gain else None,
            "costs": self.costs,
            "contenders": [index[id(r)] for r in self.contenders],
            "fastest": asdict(self.fastest) if self.fastest else None,
        }


def is_yours(row: RankedPlacement, request: Request) -> bool:
    """The plain plan's placement: --n-cpu-moe at the budget's minimum, with the request's KV cache type and ubatch."""
    mine = (request.type_k, request.type_v, request.ubatch)
    return row["placement"] == "ncmoe" and (row["type_k"], row["type_v"], row["ubatch"]) == mine


def advise(ranked: list[RankedPlacement], request: Request, model: Any) -> Advice | None:
    """The advice from rank_placements' rows (None where the user's own placement does not fit or has no score):
    among the placements predicted faster than the user's own beyond the ratio band, those the band cannot tell from
    the fastest of them, and of these the one that costs least beyond speed (then the fastest)."""
    yours = next((r for r in ranked if is_yours(r, request)), None)
    if yours is None or yours["score"] is None:
        return None
    contenders = [r for r in ranked if r["equivalent"]]
    fastest = gain(model, request, ranked[0], yours)
    faster = [r for r in ranked if r["score"] is not None and separated(model, request, r["score"], yours["score"])]
    if not faster:
        return Advice(yours, yours, None, [], contenders, fastest)
    top = faster[0]["score"]
    assert top is not None  # `faster` holds only scored rows
    alike = [r for r in faster if r["score"] is not None and not separated(model, request, top, r["score"])]
    use = min(alike, key=lambda r: len(costs(r, yours, request)))  # min is stable: the fastest of the cheapest
    return Advice(use, yours, gain(model, request, use, yours), costs(use, yours, request), contenders, fastest)


def gain(model: Any, request: Request, row: RankedPlacement, yours: RankedPlacement) -> Gain | None:
    """`row`'s predicted score over the user's own, with the ratio band (None where either has no score)."""
    if not row["score"] or not yours["score"]:
        return None
    ratio = row["score"] / yours["score"]
    width = math.exp(band(model, request, ratio))
    return Gain(ratio, ratio / width, ratio * width)


# What a KV cache type costs beyond speed: keys and values rounded to fewer bits.
KV_QUALITY = {
    "q8_0": "keys and values rounded to 8 bits, a small loss of quality",
    "q5_1": "keys and values rounded to 5 bits, a loss of quality",
    "q5_0": "keys and values rounded to 5 bits, a loss of quality",
    "q4_1": "keys and values rounded to 4 bits, a larger loss of quality, most at long context",
    "q4_0": "keys and values rounded to 4 bits, a larger loss of quality, most at long context",
}


def costs(row: RankedPlacement, yours: RankedPlacement, request: Request) -> list[str]:
    """What `row` costs beyond the objective's speed against the user's own placement, one sentence each: a KV cache
    type rounded to fewer bits than theirs, a smaller ubatch, the other test predicted slower, a whole-layer split's
    prefill the model does not give."""
    out = []
    kv = {row["type_k"], row["type_v"]} - {yours["type_k"], yours["type_v"]}
    for t in sorted(kv & set(KV_QUALITY)):
        out.append(f"A {t} KV cache: {KV_QUALITY[t]} (check it on your task).")
    if row["ubatch"] < yours["ubatch"]:
        out.append(f"A smaller ubatch (-ub {row['ubatch']}, yours {yours['ubatch']}) prefills a long prompt slower.")
    tests = OBJECTIVE_TESTS.get(request.ranked_by, ("tg", "pp"))
    for test, name in (("tg", "decode"), ("pp", "prefill")):
        mine, theirs = (row["tg"], yours["tg"]) if test == "tg" else (row["pp"], yours["pp"])
        if test not in tests and mine and theirs and mine["tok_s"] < theirs["tok_s"]:
            out.append(f"Its {name} is predicted x{mine['tok_s'] / theirs['tok_s']:.2f} of yours.")
    if row["placement"] == "ngl":
        out.append("Whole layers on the host: the speed model gives no prefill for it.")
    return out


def _row(
    placement: str, s: Setting, tg: dict[str, float] | None, pp: dict[str, float] | None, objective: str
) -> RankedPlacement:
    """A ranked placement's settings, speeds and score (the placement's own fields added by the caller)."""
    score = objective_score(objective, tg, pp)
    return {
        "placement": placement,
        "type_k": s.type_k,
        "type_v": s.type_v,
        "ubatch": s.ubatch,
        "tg": tg,
        "pp": pp,
        "score": score,
    }


def _layer_split(on: OnDevice, asked: Request, ctx: int, model: Any, s: Setting) -> list[RankedPlacement]:
    """The largest -ngl that fits the device at `ctx` (none, or every layer: nothing to add), decode only."""
    w = asked.workload(ctx, on.backend)
    device = Device(on.device.vram_bytes - on.extra_bytes - on.draft_bytes(w), on.device.kept_free)
    g = largest_ngl(on.meta, device, on.main(w))
    if g is None or g > on.meta.n_layer:
        return []
    tg = predict_ngl(on.meta, model, g, ctx, 128, s.type_k, s.type_v)
    return [_row("ngl", s, tg, None, asked.ranked_by) | {"n_cpu_moe": None, "n_gpu_layers": g, "host_tensors": []}]
