"""Stage 'budget_check' (one model): the grid's predicted, measured and llama-fit-params minimum n (over several
devices: the per-device plan against what loads on each) -> results/budget_check/{model}.csv."""

from pathlib import Path

from moeplace.core.config import Device, DeviceTarget
from moeplace.measure.budget_check import (
    CheckedModel,
    check_devices,
    check_model,
    check_table,
    devices_summary,
    devices_table,
    grid,
    summary,
)
from moeplace.model.meta import read_metadata
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    g, target = p.grid, DeviceTarget(**p.device)
    model = CheckedModel(w.model, i.model[0], read_metadata(i.metadata), Build.read(i.llamacpp), Path(snakemake.log[0]))
    workloads = grid(g["contexts"], g["ubatch"], g["cache_types"], g["flash_attn"])
    if target.other_vram_bytes:
        table = devices_table(check_devices(model, workloads, [target.vram_bytes, *target.other_vram_bytes]), w.model)
        log.info("%s: %s", w.model, devices_summary(table))
    else:
        rows = check_model(
            model,
            workloads,
            target=target,
            memory=Device(**p.memory),
            depth_checks=g["depth_checks"],
            threads=snakemake.threads,
        )
        table = check_table(rows)
        log.info("%s: %s", w.model, summary(table))
    write_csv(snakemake.output[0], table)
