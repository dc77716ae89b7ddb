"""Stage 'fidelity': every model's bench records -> out-of-sample errors of the speed model (table, summary,
figure)."""

import pandas as pd

from moeplace.ceilings import attention_costs, with_ceilings
from moeplace.fidelity import fidelity_figure, fidelity_table, summary
from moeplace.outputs import read_json, read_jsonl, stage, write_csv
from moeplace.predict import Bandwidths
from moeplace.speed import prior

with stage(snakemake.log[0]) as log:
    i, o, p = snakemake.input, snakemake.output, snakemake.params
    records = [r for path in i.bench for r in read_jsonl(path)]
    bandwidths = Bandwidths(**p.bandwidths)
    ceilings = pd.read_csv(i.ceilings) if "ceilings" in i.keys() else None
    if ceilings is not None:
        bandwidths = with_ceilings(bandwidths, ceilings)
    parts = []
    for model, meta in zip(p.models, i.metadata):
        attention, probed = attention_costs(ceilings, model) if ceilings is not None else ({}, set())
        log.info("%s: attention from the ceilings, s/GB of KV cache read: %s", model, attention or "none")
        mine = [r for r in records if r["model"] == model]
        parts.append(fidelity_table(read_json(meta), mine, prior(bandwidths, attention), probed))
    table = pd.concat(parts, ignore_index=True)
    write_csv(o.table, table)
    overview = summary(table)
    log.info("out-of-sample |error|:\n%s", overview.to_string())
    write_csv(o.summary, overview)
    devices = "; ".join(sorted({r["device"] for r in records if r.get("device")}))
    fidelity_figure(table, o.figure, devices)
