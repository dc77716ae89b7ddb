"""The *_table rules (aggregate_table, routing_table, ram_tier_table): per-part tables concatenated, each named
output the rows of the input of the same name (results/tables/measured.csv from results/tables/measured/*.csv)."""

import pandas as pd

from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    for name in snakemake.output.keys():
        parts = [pd.read_csv(path) for path in snakemake.input[name]]
        table = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else parts[0]
        write_csv(snakemake.output[name], table)
        log.info("%s: %d rows", name, len(table))
