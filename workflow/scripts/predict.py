"""Stage 'predict': metadata JSON (+ measured ceilings) -> results/tables/predicted/{model}.csv."""

import pandas as pd

from moeplace.core.config import Bandwidths, BenchSettings
from moeplace.model.meta import read_metadata
from moeplace.plan.measured_prior import measured_prior, with_ceilings
from moeplace.plan.predict import predict_table
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    meta = read_metadata(i.metadata)
    bw = Bandwidths(**p.bandwidths)
    ceilings = pd.read_csv(i.ceilings) if "ceilings" in i.keys() else None
    model, _, _ = measured_prior(bw, ceilings, snakemake.wildcards.model, meta, BenchSettings(**p.bench))
    if ceilings is not None:  # measured values fill what the config's measured section leaves unset
        bw = with_ceilings(bw, ceilings)
        log.info("corrected column with %s; the prior %s", bw, {t: m.coef for t, m in model.tests.items()})
    table = predict_table(meta, bw, model)
    log.info("predicted %d rows; n=0 %.1f tok/s, n=L %.1f tok/s", len(table), table.tok_s.iloc[0], table.tok_s.iloc[-1])
    write_csv(snakemake.output[0], table)
