"""Stage 'predict': metadata JSON (+ measured ceilings) -> results/tables/predicted/{model}.csv."""

from dataclasses import replace

import pandas as pd

from moeplace.ceilings import measured_bandwidths
from moeplace.outputs import read_json, stage, write_csv
from moeplace.predict import Bandwidths, predict_table

with stage(snakemake.log[0]) as log:
    meta = read_json(snakemake.input.metadata)
    bw = Bandwidths(**snakemake.params.bandwidths)
    if "ceilings" in snakemake.input.keys():  # measured values fill what the config's measured section leaves unset
        m = measured_bandwidths(pd.read_csv(snakemake.input.ceilings))
        bw = replace(
            bw,
            measured_ddr_gbps=bw.measured_ddr_gbps or m.get("bw_ddr_gbps"),
            measured_vram_gbps=bw.measured_vram_gbps or m.get("bw_vram_gbps"),
            measured_disk_gbps=bw.measured_disk_gbps or m.get("bw_disk_gbps"),
            measured_hop_s=bw.measured_hop_s or m.get("hop_s"),
        )
        log.info("corrected column with %s", bw)
    table = predict_table(meta, bw)
    log.info("predicted %d rows; n=0 %.1f tok/s, n=L %.1f tok/s", len(table), table.tok_s.iloc[0], table.tok_s.iloc[-1])
    write_csv(snakemake.output[0], table)
