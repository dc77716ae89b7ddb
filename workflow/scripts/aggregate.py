"""Stage 'aggregate' (one context): bench JSONL -> measured, compare and kv_check tables."""

import pandas as pd

from moeplace.aggregate import compare_table, kv_check_table, measured_table
from moeplace.outputs import read_json, read_jsonl, stage, write_csv

with stage(snakemake.log[0]) as log:
    i, o, models = snakemake.input, snakemake.output, snakemake.params.models
    records = [r for path in i.bench for r in read_jsonl(path)]
    metadata = {m: read_json(path) for m, path in zip(models, i.metadata)}
    predicted = {m: pd.read_csv(path) for m, path in zip(models, i.predicted)}
    budget = {m: pd.read_csv(path) for m, path in zip(models, i.budget)}
    measured = measured_table(records)
    write_csv(o.measured, measured)
    write_csv(o.compare, compare_table(measured, predicted, budget))
    kv = kv_check_table(records, metadata)
    write_csv(o.kv_check, kv)
    log.info(
        "%d records (%d ok); KV check: %d of %d within 1%%",
        len(measured),
        (measured.status == "ok").sum(),
        kv.within_1pct.sum(),
        len(kv),
    )
