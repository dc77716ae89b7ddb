"""Stage 'budget_check' (one model): the grid's predicted, measured and llama-fit-params minimum n (over several
devices: the per-device plan against what loads on each) -> results/budget_check/{model}.csv."""

from pathlib import Path

from moeplace.core.config import DeviceTarget
from moeplace.measure.budget_check import (
    check_devices,
    check_model,
    check_table,
    devices_summary,
    devices_table,
    grid,
    summary,
)
from moeplace.model.meta import read_metadata
from moeplace.runtime.outputs import read_json, stage, write_csv

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    g, target, manifest, log_path = p.grid, DeviceTarget(**p.device), read_json(i.llamacpp), Path(snakemake.log[0])
    workloads = grid(g["contexts"], g["ubatch"], g["cache_types"], g["flash_attn"])
    if target.other_vram_bytes:
        caps = [target.vram_bytes, *target.other_vram_bytes]
        rows = check_devices(model_path=i.model[0], meta=read_metadata(i.metadata), workloads=workloads, caps=caps,
                             manifest=manifest, log_path=log_path)  # fmt: skip
        table = devices_table(rows, w.model)
        log.info("%s: %s", w.model, devices_summary(table))
    else:
        rows = check_model(model=w.model, model_path=i.model[0], meta=read_metadata(i.metadata), workloads=workloads,
                           target=target, overhead_bytes=p.memory["overhead_bytes"], manifest=manifest,
                           log_path=log_path, depth_checks=g["depth_checks"], threads=snakemake.threads)  # fmt: skip
        table = check_table(rows)
        log.info("%s: %s", w.model, summary(table))
    write_csv(snakemake.output[0], table)
