"""Ceilings, routing, RAM smaller than the model and quant types through the real Snakefile on the tiny qwen3moe
twin: the ceilings feed the uncalibrated prediction, the routing trace and table, paging from disk below the
model, the quant table's exact bytes and both speeds, and publish showing each figure with its caption."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

from moeplace.core.units import GB
from moeplace.measure.ram_tier import non_expert_ranges
from moeplace.model.metadata import inspect_model
from moeplace.model.reads import bytes_per_token
from moeplace.plan.speed import kv_read_gb
from moeplace.runtime.cgroup import cgroup_support
from moeplace.runtime.outputs import read_jsonl

pytestmark = [pytest.mark.llamacpp, pytest.mark.long]
CFG = {
    **yaml.safe_load((ROOT / "config/config.yaml").read_text()),
    "models": {"tiny-qwen3moe": {"twin": "config/models/tiny-qwen3moe.yaml"}},
    "contexts": [1024],
    # the probes at their shortest that still read past the caches: what is asserted is their units and sums
    "ceilings": {"seconds": 0.5, "ram_probe": "256MiB"},
    "routing": {"gen": 16},
    "ram_tier": {"caps_pct": [100, 25]},
}
TARGETS = [
    "results/tables/ceilings.csv",
    "results/tables/predicted/tiny-qwen3moe.csv",
    "results/tables/routing.csv",
    "results/figures/routing_tiny-qwen3moe.png",
    "results/tables/ram_tier.csv",
    "results/figures/ram_tier_tiny-qwen3moe.png",
    "results/tables/quants.csv",
    "results/figures/quants_tiny-qwen3moe.png",
]


@pytest.fixture(scope="module")
def wd(tmp_path_factory):
    wd = workflow_copy(tmp_path_factory.mktemp("ceilings_routing_ram_quants"), CFG)
    run = snakemake(wd, *TARGETS)
    assert run.returncode == 0, run.stderr[-4000:]
    return wd


def test_ceilings_feed_the_uncalibrated_prediction(wd):
    ceilings = pd.read_csv(wd / "results/tables/ceilings.csv")
    ram = ceilings[ceilings.ceiling == "ram_read"].set_index("threads").value
    assert ram.index.tolist() == [1, 2] and (ram > 1).all()  # GB/s
    assert set(ceilings.ceiling) >= {"disk_seq_read", "disk_random_read", "dense_decode", "moe_decode"}
    decode = ceilings[ceilings.ceiling.str.endswith("decode")]
    assert (decode.value > 0).all() and decode.bound.isin(["bandwidth", "compute", "overhead"]).all()
    # effective GB/s is tok/s times the exact bytes one token reads
    meta = inspect_model(wd / "resources/models/tiny-qwen3moe.gguf")
    moe = decode[decode.subject == "tiny-qwen3moe"]
    assert moe.effective_gbps.tolist() == pytest.approx((moe.value * bytes_per_token(meta) / GB).tolist())
    # Attention timed on the device at the benchmarks' depth (1024 less the longer test) and an eighth of it, every
    # routed expert on the host (its value at such shallow depths is mostly noise: docs/measurements.md has 4K, 32K).
    attention = ceilings[ceilings.ceiling.str.startswith("attention_")].set_index("ceiling")
    assert set(attention.index) == {"attention_tg", "attention_pp"} and (attention.subject == "tiny-qwen3moe").all()
    depth = 1024 - max(CFG["bench"]["prompt"], CFG["bench"]["gen"])  # 896 with the default run's 128-token prompt
    assert (attention.depths == f"{depth // 8} {depth}").all() and (attention.n_cpu_moe == meta.n_layer).all()
    assert attention.value.notna().all() and (attention.unit == "s/GB").all()
    assert (attention.value_sd > 0).all()  # three rounds, each with its own slope
    # At the first depth the probe also ran with no expert on the host: the prior's fixed time and host cost.
    times = ceilings[ceilings.ceiling.str.startswith("time_")]
    assert sorted(zip(times.ceiling, times.n_cpu_moe)) == [(f"time_{t}", n) for t in ("pp", "tg") for n in (0, 8)]
    assert (times.depths.astype(str) == str(depth // 8)).all()
    assert (times.value > 0).all() and (times.unit == "s/token").all()
    # The prior before any calibration (predicted tables): the probe's two placements at its first depth, brought
    # to an empty cache by the measured depth cost (else the KV bytes at the RAM ceiling: the emulated device's
    # memory is host RAM); halfway between them in experts on the host, halfway in time.
    predicted = pd.read_csv(wd / "results/tables/predicted/tiny-qwen3moe.csv").set_index("n_cpu_moe")
    seconds = 1 / predicted.tg_tok_s
    cost = attention.loc["attention_tg", "value"]
    deeper = kv_read_gb(meta, depth // 8 + CFG["bench"]["gen"] / 2, "f16", "f16") - kv_read_gb(meta, 0.5, "f16", "f16")
    times = ceilings[ceilings.ceiling == "time_tg"].set_index("n_cpu_moe").value
    for n in (0, 8):
        assert seconds[n] + (cost if cost > 0 else 1 / ram[2]) * deeper == pytest.approx(times[n], rel=1e-6)
    assert seconds[4] == pytest.approx((seconds[0] + seconds[8]) / 2, rel=1e-6)


def test_routing_trace_and_table(wd):
    ids = np.load(wd / "results/routing/tiny-qwen3moe.npz")["ids"]
    assert ids.shape[1:] == (8, 4) and ids.min() >= 0 and ids.max() < 32
    assert all(len(set(row)) == 4 for row in ids.reshape(-1, 4))  # top-k ids are distinct
    table = pd.read_csv(wd / "results/tables/routing.csv")
    assert table.layer.tolist() == list(range(8)) and (table.tokens == ids.shape[0]).all()
    assert (table.overlap_uniform == 4 / 32).all() and (table.experts_80pct_uniform == 26).all()
    assert ((table.distinct_experts >= table.experts_80pct) & (table.distinct_experts <= 32)).all()


def test_ram_tier_pages_from_disk_below_the_model(wd):
    table = pd.read_csv(wd / "results/tables/ram_tier.csv")
    free = table[table.cap_pct.isna()].iloc[0]
    assert free.status == "ok" and free.tok_s > 0  # plenty of RAM needs no cgroup
    if reason := cgroup_support():
        assert (table[table.cap_pct.notna()].status == "skipped").all()
        pytest.skip(f"the capped runs need a memory cgroup: {reason}")
    assert (table.status == "ok").all(), table.error.tolist()
    quarter = table[table.cap_pct == 25]
    assert free.faults_per_token < 1  # the whole model stays in RAM
    assert (quarter.faults_per_token > 10).all() and (quarter.tok_s < free.tok_s).all()
    locked = sum(n for _, ranges in non_expert_ranges(wd / "resources/models/tiny-qwen3moe.gguf") for _, n in ranges)
    assert table[table.lock == "non_expert"].locked_mb.tolist() == pytest.approx([locked / 1e6] * 2)
    assert table.readahead.str.startswith("128 KiB").all() or table.readahead.eq("madvise random").all()


def test_quant_table_gives_exact_bytes_and_both_speeds(wd):
    table = pd.read_csv(wd / "results/tables/quants.csv").set_index("quant")
    q4, q2 = (inspect_model(wd / f"resources/quants/tiny-qwen3moe/{q}.gguf") for q in ("Q4_K_M", "Q2_K"))
    assert table.loc["Q2_K", "bytes_ratio"] == pytest.approx(bytes_per_token(q4) / bytes_per_token(q2))
    assert table.loc["Q4_K_M", "file_gb"] > table.loc["Q2_K", "file_gb"]
    assert (table.tok_s > 0).all()
    # the speeds are the uncapped runs' own, as the stage recorded them (its JSON lines, by quant)
    runs = [r for r in read_jsonl(wd / "results/quants/tiny-qwen3moe.jsonl") if r.get("cap_pct") is None]
    measured = {q: next(r["tok_s"] for r in runs if r["quant"] == q) for q in ("Q4_K_M", "Q2_K")}
    assert table.tok_s.to_dict() == pytest.approx(measured)
    assert table.loc["Q2_K", "tok_s_ratio"] == pytest.approx(measured["Q2_K"] / measured["Q4_K_M"])
    if reason := cgroup_support():
        pytest.skip(f"the capped comparison needs a memory cgroup: {reason}")
    assert (table.tok_s_capped > 0).all()


def test_publish_after_every_stage_shows_each_figure_with_its_rendered_caption(wd):
    """The per-model figures (routing, RAM tier, quants) have captions of their own rule: publish finds them by
    the figure's wildcards and renders their reStructuredText (no double backticks left on the page)."""
    run = snakemake(wd, "publish")
    assert run.returncode == 0, run.stderr[-3000:]
    (index,) = wd.glob("publish/*/index.html")
    page = index.read_text()
    for figure in ("routing_tiny-qwen3moe.png", "ram_tier_tiny-qwen3moe.png", "quants_tiny-qwen3moe.png"):
        caption = page.split(f"figures/{figure}", 1)[1].split("</figcaption>", 1)[0]
        assert len(caption) > 60, figure  # a caption, not an empty one
    assert "``" not in page and ("<tt class=" in page or "<code" in page)
