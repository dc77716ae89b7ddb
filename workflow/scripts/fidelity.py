"""Stage 'fidelity': every model's bench records -> out-of-sample errors of the speed model (table, summary,
figure)."""

import pandas as pd

from moeplace.ceilings import with_ceilings
from moeplace.fidelity import fidelity_figure, fidelity_table, summary
from moeplace.outputs import read_json, read_jsonl, stage, write_csv
from moeplace.predict import Bandwidths
from moeplace.speed import prior

with stage(snakemake.log[0]) as log:
    i, o, p = snakemake.input, snakemake.output, snakemake.params
    records = [r for path in i.bench for r in read_jsonl(path)]
    bandwidths = Bandwidths(**p.bandwidths)
    if "ceilings" in i.keys():
        bandwidths = with_ceilings(bandwidths, pd.read_csv(i.ceilings))
    base = prior(bandwidths)
    parts = [
        fidelity_table(read_json(meta), [r for r in records if r["model"] == model], base)
        for model, meta in zip(p.models, i.metadata)
    ]
    table = pd.concat(parts, ignore_index=True)
    write_csv(o.table, table)
    overview = summary(table)
    log.info("out-of-sample |error|:\n%s", overview.to_string())
    write_csv(o.summary, overview)
    devices = "; ".join(sorted({r["device"] for r in records if r.get("device")}))
    fidelity_figure(table, o.figure, devices)
