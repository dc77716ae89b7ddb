"""Stage 'budget_check' (one model): the grid's predicted, measured and llama-fit-params minimum n ->
results/budget_check/{model}.csv."""

from pathlib import Path

from moeplace.core.config import DeviceTarget
from moeplace.measure.budget_check import check_model, check_table, grid, summary
from moeplace.runtime.outputs import read_json, stage, write_csv

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    g = p.grid
    rows = check_model(
        model=w.model,
        model_path=i.model[0],
        meta=read_json(i.metadata),
        workloads=grid(g["contexts"], g["ubatch"], g["cache_types"], g["flash_attn"]),
        target=DeviceTarget(**p.device),
        overhead_bytes=p.memory["overhead_bytes"],
        manifest=read_json(i.llamacpp),
        log_path=Path(snakemake.log[0]),
        depth_checks=g["depth_checks"],
        threads=snakemake.threads,
    )
    table = check_table(rows)
    log.info("%s: %s", w.model, summary(table))
    write_csv(snakemake.output[0], table)
