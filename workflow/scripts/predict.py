"""Stage 'predict': metadata JSON -> results/tables/predicted/{model}.csv."""

from moeplace.outputs import read_json, stage, write_csv
from moeplace.predict import Bandwidths, predict_table

with stage(snakemake.log[0]) as log:
    meta = read_json(snakemake.input.metadata)
    table = predict_table(meta, Bandwidths(**snakemake.params.bandwidths))
    log.info("predicted %d rows; n=0 %.1f tok/s, n=L %.1f tok/s", len(table), table.tok_s.iloc[0], table.tok_s.iloc[-1])
    write_csv(snakemake.output[0], table)
