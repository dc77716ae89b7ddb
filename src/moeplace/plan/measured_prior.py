"""The speed model's prior from this host's measured ceilings (results/tables/ceilings.csv, written by the
ceilings stage): the bandwidths the config's measured: section leaves unset, each model's attention cost with its
spread, and the fixed time and host cost of the attention probe's own runs (speed_fit.anchored). Without a ceilings
table, the prior of the configured bandwidths alone."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ..core.config import Bandwidths, BenchSettings
from ..model.meta import ModelMeta
from .speed import Run, SpeedModel, prior
from .speed_fit import anchored


def probe_run(bench: BenchSettings, n_cpu_moe: int, depth: int, test: str) -> Run:
    """A run of the attention probe: llama-bench with the benchmarks' settings (see bench_command)."""
    n_tokens = bench.gen if test == "tg" else bench.prompt
    return Run(n_cpu_moe, depth, test, n_tokens, bench.ubatch, bench.type_k, bench.type_v)


def attention_costs(
    ceilings: pd.DataFrame, model: str
) -> tuple[dict[str, float], dict[str, float], set[tuple[int, int]]]:
    """`model`'s measured attention cost per test (s/GB of KV cache read; a slope that is not positive is
    noise, left out), its spread between the probe's rounds where measured, and the (n_cpu_moe, depth)
    configurations its probe ran."""
    mine = ceilings[ceilings.subject == model]
    rows = mine[mine.ceiling.str.startswith("attention_")]
    costs, spreads = {}, {}
    records = rows.to_dict("records")
    for r in records:
        test = str(r["ceiling"]).removeprefix("attention_")
        if r["value"] > 0:
            costs[test] = float(r["value"])
            if pd.notna(r.get("value_sd")):  # tables written before the spread was measured lack it
                spreads[test] = float(r["value_sd"])
    probed = {(int(r["n_cpu_moe"]), int(float(d))) for r in records for d in str(r["depths"]).split()}
    return costs, spreads, probed


def measured_prior(
    bw: Bandwidths, ceilings: pd.DataFrame | None, model: str, meta: ModelMeta, bench: BenchSettings
) -> tuple[SpeedModel, set[tuple[int, int]], set[tuple[int, int]]]:
    """The speed model's prior for `model` (`meta`): `bw` with the ceilings' measured values where the config
    leaves them unset, the model's measured attention cost with its spread, and its fixed time and host cost
    from the probe's own runs (made with `bench`); the (n_cpu_moe, depth) configurations the attention cost
    came from (every fit carries it), and those the fixed time and host cost came from (the prior alone holds
    them: a fit frees both). Without a ceilings table, the prior of `bw` alone."""
    if ceilings is None:
        return prior(bw), set(), set()
    attention, spread, probed = attention_costs(ceilings, model)
    times = ceilings[(ceilings.subject == model) & ceilings.ceiling.str.startswith("time_")]
    anchors = [
        replace(
            probe_run(bench, int(r["n_cpu_moe"]), int(r["depths"]), str(r["ceiling"]).removeprefix("time_")),
            tok_s=1 / r["value"],
        )
        for r in times.to_dict("records")
        if r["value"] > 0
    ]
    base = anchored(meta, prior(with_ceilings(bw, ceilings), attention, spread), anchors)
    return base, probed, {(r.n_cpu_moe, r.depth) for r in anchors}


def measured_bandwidths(ceilings: pd.DataFrame) -> dict[str, float]:
    """What the speed model's prior uses: the RAM ceiling at the most threads; the device's copy bandwidth
    on a GPU, the RAM ceiling on the emulated device (its memory is this host's RAM); the hop's round trip;
    the disk's random reads."""

    def value(name: str) -> float | None:
        values = ceilings[ceilings.ceiling == name].value.dropna()
        return float(values.iloc[0]) if not values.empty else None

    ram = ceilings[ceilings.ceiling == "ram_read"].sort_values("threads")
    out: dict[str, float] = {}
    if not ram.empty:
        out["bw_ddr_gbps"] = float(ram.value.iloc[-1])
    if device_copy := value("device_copy"):
        out["bw_vram_gbps"] = device_copy
    elif not ram.empty and not (ceilings.ceiling == "device_decode").any():  # the emulated device
        out["bw_vram_gbps"] = out["bw_ddr_gbps"]
    if round_trip := value("hop_round_trip"):  # a round trip is two hops: activations to the host and back
        out["hop_s"] = round_trip * 1e-6 / 2
    if disk := value("disk_random_read"):
        out["bw_disk_gbps"] = disk / 1e3
    return out


def with_ceilings(bw: Bandwidths, ceilings: pd.DataFrame) -> Bandwidths:
    """`bw` with the measured values the config's measured: section leaves unset taken from the ceilings."""
    m = measured_bandwidths(ceilings)
    return replace(
        bw,
        measured_ddr_gbps=bw.measured_ddr_gbps or m.get("bw_ddr_gbps"),
        measured_vram_gbps=bw.measured_vram_gbps or m.get("bw_vram_gbps"),
        measured_disk_gbps=bw.measured_disk_gbps or m.get("bw_disk_gbps"),
        measured_hop_s=bw.measured_hop_s or m.get("hop_s"),
    )
