"""Concatenate per-part tables: each named output is the rows of the input of the same name."""

import pandas as pd

from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    for name in snakemake.output.keys():
        parts = [pd.read_csv(path) for path in snakemake.input[name]]
        table = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else parts[0]
        write_csv(snakemake.output[name], table)
        log.info("%s: %d rows", name, len(table))
