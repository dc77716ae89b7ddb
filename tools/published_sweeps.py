"""Published --n-cpu-moe sweeps of real cards (tools/published/, sources in its SOURCES.md and HELDOUT_SOURCES.md)
as the speed model sees them: the points it covers, on header-only twins of their models; shared by the speed
tests and tools/speed_prior.py, which learns the uncalibrated prior from them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from moeplace.model.memory import device_weight_bytes
from moeplace.model.meta import ModelMeta
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.learned_prior import Machine, Point, point_features
from moeplace.plan.speed import Run

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "tools/published"
SPECS = {
    "Qwen3-30B-A3B": ROOT / "config/models/qwen3-coder-30b-a3b.yaml",
    "Qwen3-Coder-30B-A3B-Instruct": ROOT / "config/models/qwen3-coder-30b-a3b.yaml",
    "gpt-oss-20b": ROOT / "config/models/gpt-oss-20b.yaml",  # MXFP4 experts: the published files' bytes
    "gpt-oss-120b": ROOT / "config/models/gpt-oss-120b.yaml",
    "Qwen3.5-35B-A3B": ROOT / "config/models/qwen3.6-35b-a3b.yaml",  # the same architecture and shapes
    "Qwen3.6-35B-A3B": ROOT / "config/models/qwen3.6-35b-a3b.yaml",
    "gemma-4-26B-A4B-it": ROOT / "config/models/gemma-4-26b-a4b.yaml",
}
SWEEP = ["setup", "model", "test", "size", "ubatch", "flash_attn", "type_k", "type_v"]  # one published sweep
# The host RAM of a source that does not say it: DDR5-5600 in two channels, what the desktops the sources name
# (Core Ultra 7 265K, Ryzen 7000/9000) run at their rated speed.
ASSUMED_HOST_GBPS = 89.6
BACKENDS = {"CUDA": "cuda", "ROCm": "rocm", "ROCm/HIP": "rocm", "Vulkan": "vulkan", "SYCL": "sycl"}
# Sources (source_id) that are one machine: a left-out score leaves the machine out, all its sources together.
MACHINES = {
    "ik_llama-disc357": "ikawrakow: Ryzen 9 7950X + RTX 4080",
    "ik_llama-issue437": "ikawrakow: Ryzen 9 7950X + RTX 4080",
    "ik_llama-issue490": "ikawrakow: Ryzen 9 7950X + RTX 4080",
    "ik_llama-disc758": "ikawrakow: Ryzen 9 7950X + RTX 4080",
    "ik_llama-pr841": "ikawrakow: Ryzen 9 7950X + RTX 4080",
}
# A setup named for the KV cache type or ubatch it ran (…-kvq8, …-ub2048) is one of its machine's family of setups
# that differ only in what a user chooses: a ratio between placements is scored within a family.
CHOSEN_SUFFIX = re.compile(r"-(kv(f16|q8|q4)|ub\d+)$")
# A server's decode rate where the source does not say how many tokens it generated: decode speed hardly depends
# on the count, so such a point is taken as llama-bench's default tg128.
UNSTATED_N_GEN = 128


def published(csv: str = "sweeps.csv", host: str = "datasheet") -> pd.DataFrame:
    """The published points the speed model covers: a model with a twin spec, a placement, and no --swa-full
    (llama-bench always runs without it, and the KV bytes follow llama-bench); with the card's datasheet
    memory bandwidth, FP32 throughput and PCIe link (gpus.csv) and the host's RAM bandwidth where the source says
    it (hosts.csv; else ASSUMED_HOST_GBPS). host="measured": only the setups whose source also measured the host's
    RAM read (hosts.csv measured_gbps), with that figure, as a user who gives --bw-ddr-measured."""
    t = pd.read_csv(PUBLISHED / csv)
    t = t[t.model.isin(SPECS) & t.n_cpu_moe.notna() & ~t.setup.str.endswith("-swafull")].copy()
    gpus = pd.read_csv(PUBLISHED / "gpus.csv").set_index("gpu")
    card = t.gpu.str.split(" (", regex=False).str[0]
    t["gpu_gbps"], t["link_gbps"] = card.map(gpus.memory_gbps), card.map(gpus.link_gbps)
    t["gpu_tflops"] = card.map(gpus.fp32_tflops)
    assert t.gpu_gbps.notna().all(), "a card without its bandwidth in gpus.csv"
    hosts = pd.read_csv(PUBLISHED / "hosts.csv").set_index("setup")
    t["host_gbps"] = t.setup.map(hosts.host_gbps).fillna(ASSUMED_HOST_GBPS)
    kind = hosts.kind if "kind" in hosts else pd.Series("datasheet", index=hosts.index)
    t["host_measured"] = t.setup.map(kind).fillna("datasheet").eq("measured")
    if host == "measured":
        measured = t.setup.map(hosts.measured_gbps) if "measured_gbps" in hosts else pd.Series(np.nan, index=t.index)
        t = t[measured.notna()].assign(host_gbps=measured[measured.notna()], host_measured=True)
    # A left-out score leaves a whole source out: every setup of its author (one person's machines, or machine),
    # and every source of one machine (MACHINES).
    t["machine"] = t.source_id.map(MACHINES).fillna(t.source_id)
    t["n_gen"] = t.n_gen.where(t.n_gen.notna() | (t.test != "tg"), UNSTATED_N_GEN)
    t["n_depth"] = t.n_depth.fillna(0).astype(int)
    t["ubatch"] = t.ubatch.fillna(512).astype(int)
    t[["type_k", "type_v"]] = t[["type_k", "type_v"]].fillna("f16")
    t["flash_attn"] = t.flash_attn.fillna("").astype(str)
    t["size"] = np.where(t.test == "tg", t.n_gen, t.n_prompt)
    t = t[t["size"].notna()]
    # Where a source measured a point with a warm page cache (its log read less than half the model from disk),
    # that measurement stands: a run reading the model from disk measures the disk (gpt-oss-120b's, 2x slower).
    warm = t.disk_read_mib < t.model_size_gib * 1024 / 2
    point = t[["setup", *SWEEP[1:], "n_cpu_moe", "n_depth"]].apply(tuple, axis=1)
    return t[warm | ~point.isin(set(point[warm]))]


def spilled(meta: ModelMeta, point: pd.Series) -> bool:
    """Whether a published point's device weights alone (the twin's, scaled to the file's size where the source
    gives it) exceed the card's memory: it ran only because the driver spilled to system RAM (Windows does by
    default), which the speed model does not cover, so it is neither fitted nor scored."""
    scale = point.model_size_gib * 2**30 / meta.total_bytes if point.model_size_gib > 0 else 1.0
    n = min(int(point.n_cpu_moe), meta.n_layer)
    return device_weight_bytes(meta, n) * scale > point.gpu_vram_gib * 2**30


def twins(tmp: Path) -> dict[Path, ModelMeta]:
    """Each spec's header-only twin, inspected."""
    return {spec: inspect_model(write_twin(load_spec(spec), tmp / spec.name, "none")) for spec in set(SPECS.values())}


def sweeps(table: pd.DataFrame, metas: dict[Path, ModelMeta]):
    """Each published sweep (see SWEEP): its key, its model's twin and its points, repeated runs of a point
    averaged, spilled points left out."""
    for key, g in table.groupby(SWEEP):
        meta = metas[SPECS[key[1]]]
        g = g[~g.apply(lambda r: spilled(meta, r), axis=1)]
        points = g.groupby(["n_cpu_moe", "n_depth"], as_index=False).agg(
            tok_s=("tok_s", "mean"),
            **{
                k: (k, "first")
                for k in (
                    "gpu_gbps",
                    "host_gbps",
                    "link_gbps",
                    "gpu_tflops",
                    "backend",
                    "model_size_gib",
                    "host_measured",
                    "machine",
                )
            },
        )
        yield key, meta, points


WEIGHT_FEATURES = ("device_gb", "host_gb", "link_gb", "active_gb")


def prior_points(table: pd.DataFrame, metas: dict[Path, ModelMeta]) -> list[Point]:
    """The published points as the learned prior takes them; where the source gives the file's size, the weight
    bytes scaled from the twin's quant to the file's (a Q2_K file reads a third less than the twin's Q4_K_M)."""
    out = []
    for (setup, _, test, size, ubatch, _, type_k, type_v), meta, g in sweeps(table, metas):
        for r in g.itertuples():
            run = Run(min(int(r.n_cpu_moe), meta.n_layer), r.n_depth, test, int(size), ubatch, type_k, type_v)
            machine = Machine(
                BACKENDS[r.backend], r.gpu_gbps, r.host_gbps, r.link_gbps, r.gpu_tflops, bool(r.host_measured)
            )
            scale = r.model_size_gib * 2**30 / meta.total_bytes if r.model_size_gib > 0 else 1.0
            x = {k: v * scale if k in WEIGHT_FEATURES else v for k, v in point_features(meta, run).items()}
            settings = {"n_cpu_moe": run.n_cpu_moe, "depth": int(run.depth), "size": int(size), "ubatch": int(ubatch)}
            settings |= {"type_k": type_k, "type_v": type_v}
            family = CHOSEN_SUFFIX.sub("", setup)
            out.append(Point(setup, test, machine, x, r.tok_s, r.machine.strip(), family, settings))
    return out
