"""Stage 'predict': metadata JSON (+ measured ceilings) -> results/tables/predicted/{model}.csv."""

import pandas as pd

from moeplace.ceilings import with_ceilings
from moeplace.outputs import read_json, stage, write_csv
from moeplace.predict import Bandwidths, predict_table

with stage(snakemake.log[0]) as log:
    meta = read_json(snakemake.input.metadata)
    bw = Bandwidths(**snakemake.params.bandwidths)
    if "ceilings" in snakemake.input.keys():  # measured values fill what the config's measured section leaves unset
        bw = with_ceilings(bw, pd.read_csv(snakemake.input.ceilings))
        log.info("corrected column with %s", bw)
    table = predict_table(meta, bw)
    log.info("predicted %d rows; n=0 %.1f tok/s, n=L %.1f tok/s", len(table), table.tok_s.iloc[0], table.tok_s.iloc[-1])
    write_csv(snakemake.output[0], table)
