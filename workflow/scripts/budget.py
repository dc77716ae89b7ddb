"""Stage 'budget': metadata JSON (+ the model and llama.cpp) -> results/tables/budget/{model}.csv (minimum n per
context, each device buffer counted)."""

from pathlib import Path

from moeplace.core.config import Device, DeviceTarget
from moeplace.model.memory import Workload
from moeplace.model.meta import read_metadata
from moeplace.plan.budget import budget_table, compute_from_llamacpp
from moeplace.plan.devices_budget import devices_budget_table
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    meta = read_metadata(i.metadata)
    cache = (p.ubatch, p.flash_attn, p.cache_type_k, p.cache_type_v)
    model, manifest = (i.model[0], Build.read(i.llamacpp)) if "model" in i.keys() else (None, None)
    target, log_path = DeviceTarget(**p.device), Path(snakemake.log[0])
    if target.other_vram_bytes:  # several devices
        workloads = [Workload(ctx, *cache) for ctx in p.contexts]
        table = devices_budget_table(meta, model, manifest, target, Device(**p.memory), workloads, log_path)
    else:
        with compute_from_llamacpp(model, manifest, target, Device(**p.memory), log_path) as on:
            table = budget_table(meta, on.device, [on.workload(ctx, *cache) for ctx in p.contexts], on.compute)
    for row in table.itertuples():
        log.info("ctx %d: %s, n_cpu_moe %s (compute buffer from %s)", row.ctx, row.status, row.n_cpu_moe,
                 row.compute_source)  # fmt: skip
    write_csv(snakemake.output[0], table)
