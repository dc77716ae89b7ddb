"""Stage 'budget': metadata JSON -> results/tables/budget/{model}.csv (minimum n per context)."""

from moeplace.budget import Device, budget_table
from moeplace.outputs import read_json, stage, write_csv

with stage(snakemake.log[0]) as log:
    p = snakemake.params
    meta = read_json(snakemake.input.metadata)
    table = budget_table(meta, Device(**p.memory), p.contexts, p.cache_type_k, p.cache_type_v)
    for row in table.itertuples():
        log.info("ctx %d: %s, n_cpu_moe %s", row.ctx, row.status, row.n_cpu_moe)
    write_csv(snakemake.output[0], table)
