"""Stage 'aggregate' (one context): bench JSONL -> measured, compare (out-of-sample predictions) and memory_check."""

import pandas as pd

from moeplace.core.config import Bandwidths
from moeplace.model.meta import read_metadata
from moeplace.plan.speed import prior
from moeplace.report.aggregate import compare_table, measured_table, memory_check_table
from moeplace.runtime.outputs import read_jsonl, stage, write_csv

with stage(snakemake.log[0]) as log:
    i, o, p = snakemake.input, snakemake.output, snakemake.params
    records = [r for path in i.bench for r in read_jsonl(path)]
    metadata = {m: read_metadata(path) for m, path in zip(p.models, i.metadata)}
    budget = {m: pd.read_csv(path) for m, path in zip(p.models, i.budget)}
    measured = measured_table(records)
    write_csv(o.measured, measured)
    compare = compare_table(measured, records, metadata, budget, prior(Bandwidths(**p.bandwidths)))
    write_csv(o.compare, compare)
    memory = memory_check_table(records, metadata)
    write_csv(o.memory_check, memory)
    log.info(
        "%d records (%d ok); median out-of-sample |error| tg %.1f%%, pp %.1f%%; memory check: %d of %d buffers agree",
        len(measured),
        (measured.status == "ok").sum(),
        compare.tg_error_pct.abs().median(),
        compare.pp_error_pct.abs().median(),
        memory.within_tolerance.sum(),
        len(memory),
    )
