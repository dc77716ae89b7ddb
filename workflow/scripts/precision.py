"""Stage 'aggregate' (precision): measured and variants tables -> results/tables/precision.csv."""

import pandas as pd

from moeplace.report.aggregate import precision_table
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    measured = pd.read_csv(snakemake.input.measured)
    variants = pd.concat([pd.read_csv(path) for path in snakemake.input.variants], ignore_index=True)
    table = precision_table(measured, variants)
    log.info("precision:\n%s", table.to_string())
    write_csv(snakemake.output[0], table)
