"""`moeplace tune --placement optimal`: the placements the speed model cannot tell apart, measured on this machine.

The ranking (plan/optimal.py) calls equivalent the placements whose predicted ratio to the best lies inside the
ratio band, learned from published sweeps (docs/speed-prior.md); which of them is faster on this machine only a run
says. They race in interleaved rounds, as the -ot variants stage measures a variant against -ncmoe
(measure/placement.py): each round runs every contender once, in an order rotated round by round, so a slow spell
of the host falls on all alike. From FEWEST_ROUNDS on, a contender whose 95% interval of its difference from the
leader (Welch's, over the rounds' speeds) lies below 0 stops; the race ends when one is left (clearly ahead of every
other) or at MAX_ROUNDS. The runs then calibrate the speed model, whose band is its own fit's, narrower than the
published one, and the list is ranked again with it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.config import BenchSettings, Device, DeviceTarget
from ..core.records import BenchRecord, JsonObject
from ..core.stats import delta_interval
from ..model.meta import ModelMeta
from ..plan import commands
from ..plan.calibrate import calibration_file
from ..plan.offload import ot_value
from ..plan.optimal import OnDevice, RankedPlacement, advise, objective_score, rank_placements
from ..plan.request import Request
from ..plan.speed import SpeedModel
from ..runtime.device import DeviceSetup, device_setup
from ..runtime.llamacpp_args import batch_for
from .bench import BenchJob, run_bench
from .tune import Probing

MAX_CONTENDERS = 4  # the user's own placement among them
FEWEST_ROUNDS, MAX_ROUNDS = 3, 8
REPETITIONS, GEN = 2, 32  # per contender and round: llama-bench's repetitions of each test, tokens generated


@dataclass
class Contender:
    """One placement in the race: its ranked row, the objective's measured tok/s of each round it ran, its records,
    and why it stopped running if it failed (a placement the plan fits that llama.cpp would not load)."""

    row: RankedPlacement
    rounds: list[float] = field(default_factory=list)
    records: list[BenchRecord] = field(default_factory=list)
    failure: str | None = None

    @property
    def speed(self) -> float:
        return statistics.fmean(self.rounds) if self.rounds else 0.0


@dataclass
class Race:
    """The measured contenders, the winner (the fastest measured mean), and the winner's difference from each other
    contender that ran: (relative difference, its 95% interval's low and high), by the other's index."""

    contenders: list[Contender]
    winner: Contender | None
    rounds: int
    intervals: dict[int, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def clear(self) -> bool:
        """Whether the winner is ahead of every other that ran beyond its interval."""
        return self.winner is not None and all(low > 0 for _, low, _ in self.intervals.values())


def relative_difference(faster: list[float], slower: list[float]) -> tuple[float, float, float]:
    """(mean difference, low, high) of two contenders' round speeds, relative to the second's mean."""
    mean = statistics.fmean(slower)
    delta, low, high = delta_interval(faster, slower)
    return delta / mean, low / mean, high / mean


# One run of a placement: its tok/s by test ("tg", "pp"), or why it failed.
Measure = Callable[[RankedPlacement], dict[str, float] | str]


def race(rows: list[RankedPlacement], measure: Measure, objective: str) -> Race:
    """Race `rows`, one `measure(row)` each round, scored by the request's objective (optimal.objective_score)."""
    contenders = [Contender(r) for r in rows]
    running = list(contenders)
    rounds = 0
    while running and rounds < MAX_ROUNDS:
        for c in running[rounds % len(running) :] + running[: rounds % len(running)]:
            measured = measure(c.row)
            if isinstance(measured, str):
                c.failure = measured
                continue
            tg, pp = ({"tok_s": measured[t]} if t in measured else None for t in ("tg", "pp"))
            c.rounds.append(objective_score(objective, tg, pp) or 0.0)
        rounds += 1
        running = [c for c in running if not c.failure]
        if rounds < FEWEST_ROUNDS or len(running) < 2:
            continue
        leader = max(running, key=lambda c: c.speed)
        # behind: the leader's lead over it is above 0 at the interval's low end (NaN, too few rounds: not behind)
        running = [c for c in running if c is leader or not relative_difference(leader.rounds, c.rounds)[1] > 0]
        if len(running) == 1:
            break
    ran = [c for c in contenders if c.rounds]
    winner = max(ran, key=lambda c: c.speed, default=None)
    intervals = {
        i: relative_difference(winner.rounds, c.rounds)
        for i, c in enumerate(contenders)
        if winner is not None and c.rounds and c is not winner
    }
    return Race(contenders, winner, rounds, intervals)


def bench_placement(row: RankedPlacement) -> tuple[int, str | None, int]:
    """The llama-bench placement of a ranked row: (--n-cpu-moe, -ot value, -ngl)."""
    if row["placement"] == "optimal":
        return 0, ot_value(set(row["host_tensors"])) or None, 99
    if row["placement"] == "ngl":
        return 0, None, row["n_gpu_layers"]
    return row["n_cpu_moe"] or 0, None, 99


def server_line(model: str, ctx: int, row: RankedPlacement, request: Request) -> str:
    """The llama-server line that runs a ranked row (no pins: tune takes none)."""
    n, overrides, ngl = bench_placement(row)
    cache = request.cache((row["type_k"], row["type_v"]), row["ubatch"])
    rules = (overrides,) if overrides else ()
    n_cpu_moe = None if overrides or row["placement"] == "ngl" else n  # the rules or -ngl are the placement
    return commands.llama_server(model, ctx, n_cpu_moe, cache, rules, n_gpu_layers=ngl)


@dataclass
class PlacementTune:
    """What tune --placement optimal found: the ranking before any run, the race of its contenders, and the ranking
    again with the calibration their runs gave (None where they could not calibrate)."""

    ranked: list[RankedPlacement]
    race: Race
    calibration: JsonObject | None
    reranked: list[RankedPlacement] | None


def contenders_of(ranked: list[RankedPlacement], request: Request, model: SpeedModel) -> list[RankedPlacement]:
    """The placements to measure: the best predicted that the ratio band cannot tell from the best, and the user's
    own (the plain plan's) beside them, MAX_CONTENDERS in all."""
    advice = advise(ranked, request, model)
    if advice is None:
        return []
    others = [r for r in advice.contenders if r is not advice.yours][: MAX_CONTENDERS - 1]
    return sorted([*others, advice.yours], key=lambda r: -(r["score"] or 0.0))


def bench_measure(
    meta: ModelMeta, model_path: str, request: Request, ctx: int, device: DeviceSetup, probing: Probing, prompt: int
) -> tuple[Measure, dict[int, list[BenchRecord]]]:
    """race's `measure` on `device`: one llama-bench process of a ranked row at `ctx` (its KV cache filled so that
    the largest test holds `ctx` cells, as the tune probes allocate), decode and, with a `prompt`, prefill; with the
    records of each row (by id) as they come."""
    found: dict[int, list[BenchRecord]] = {}

    def measure(row: RankedPlacement) -> dict[str, float] | str:
        n, overrides, ngl = bench_placement(row)
        settings = BenchSettings(
            prompt=prompt,
            gen=GEN,
            repetitions=REPETITIONS,
            threads=probing.settings.threads,
            timeout_s=probing.settings.timeout_s,
            type_k=row["type_k"],
            type_v=row["type_v"],
            ubatch=row["ubatch"],
            flash_attn=request.flash_attn,
        )
        job = BenchJob(meta.name, model_path, meta.file_records(), ctx, n, "contender", overrides, n_gpu_layers=ngl)
        records = run_bench(job, probing.rig(settings, device))
        found.setdefault(id(row), []).extend(records)
        failed = [r for r in records if r["status"] != "ok"]
        if failed:
            return f"{failed[0]['status']}: {failed[0].get('error') or 'see the log'}"
        speeds = {}
        for r in records:
            value = r.get("median_ts") or r["avg_ts"]
            assert value is not None, r  # an ok record has its speed
            speeds[r["test"]] = float(value)
        return speeds

    return measure, found


def tune_placements(
    meta: ModelMeta,
    model_path: str,
    request: Request,
    ctx: int,
    target: DeviceTarget,
    probing: Probing,
    model: SpeedModel,
) -> PlacementTune:
    """Rank the placements that fit `target` at `ctx` (as llama-bench runs them: the probes' own workload), race the
    contenders on the device, calibrate the speed model with their runs and rank again."""
    device = device_setup(target, probing.manifest)
    on = OnDevice(meta, Device(device.cap_bytes, 0), "rpc")
    ranked = rank_placements(on, request, ctx, model)
    rows = contenders_of(ranked, request, model)
    prefill = request.ranked_by != "decode"
    prompt = batch_for(max((r["ubatch"] for r in rows), default=request.ubatch)) if prefill else 0
    measure, found = bench_measure(meta, model_path, request, ctx, device, probing, prompt)
    raced = race(rows, measure, request.ranked_by)
    for c in raced.contenders:
        c.records = found.get(id(c.row), [])
    # a whole-layer split's runs say nothing calibrate reads (it takes every layer as on the card): left out
    records = [r for c in raced.contenders if c.row["placement"] != "ngl" for r in c.records]
    calibration = calibration_file(meta, records, model) if records else None
    reranked = None
    if calibration and calibration["status"] == "calibrated":
        reranked = rank_placements(on, request, ctx, SpeedModel.from_json(calibration))
    return PlacementTune(ranked, raced, calibration, reranked)


def race_record(found: PlacementTune, model: str, ctx: int, request: Request) -> JsonObject:
    """The race as the pipeline's tune_placement stage writes it: each contender's placement, predicted and measured
    speed (or failure) and its difference from the winner with that difference's 95% interval; the winner and its
    llama-server line."""
    raced = found.race
    contenders = []
    for i, c in enumerate(raced.contenders):
        n, overrides, ngl = bench_placement(c.row)
        delta = raced.intervals.get(i)
        contenders.append(
            {
                "placement": c.row["placement"],
                "n_cpu_moe": n,
                "override_tensor": overrides,
                "n_gpu_layers": ngl,
                "type_k": c.row["type_k"],
                "type_v": c.row["type_v"],
                "ubatch": c.row["ubatch"],
                "predicted": c.row["score"],
                "measured": c.speed if c.rounds else None,
                "rounds": c.rounds,
                "failure": c.failure,
                "winner_over_it": dict(zip(("delta", "low", "high"), delta)) if delta else None,
            }
        )
    winner = raced.winner
    return {
        "model": model,
        "ctx": ctx,
        "objective": request.ranked_by,
        "rounds": raced.rounds,
        "contenders": contenders,
        "winner": raced.contenders.index(winner) if winner else None,
        "clear": raced.clear,
        "command": server_line(request.model or model, ctx, winner.row, request) if winner else None,
        "calibrated": bool(found.calibration and found.calibration["status"] == "calibrated"),
    }
