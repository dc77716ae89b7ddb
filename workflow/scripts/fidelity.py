"""Stage 'fidelity': every model's bench records -> out-of-sample errors of the speed model (table, summary,
figure)."""

import pandas as pd

from moeplace.core.config import Bandwidths, BenchSettings
from moeplace.model.meta import read_metadata
from moeplace.plan.measured_prior import measured_prior
from moeplace.report.fidelity import fidelity_table, summary
from moeplace.report.figures.fidelity import fidelity_figure
from moeplace.runtime.outputs import read_jsonl, stage, write_csv

with stage(snakemake.log[0]) as log:
    i, o, p = snakemake.input, snakemake.output, snakemake.params
    records = [r for path in i.bench for r in read_jsonl(path)]
    if partial := sum(1 for r in records if r.get("partial") and r.get("status") != "ok"):
        log.warning("left out %d records of runs that failed after some repetitions: not scored", partial)
    ceilings = pd.read_csv(i.ceilings) if "ceilings" in i.keys() else None
    parts = []
    bandwidths, bench = Bandwidths(**p.bandwidths), BenchSettings(**p.bench)
    for model, path in zip(p.models, i.metadata):
        meta = read_metadata(path)
        base, probed, anchors = measured_prior(bandwidths, ceilings, model, meta, bench)
        log.info("%s: the prior, %s", model, {t: (m.coef, m.source) for t, m in base.tests.items()})
        mine = [r for r in records if r["model"] == model]
        parts.append(fidelity_table(meta, mine, base, probed, anchors))
    table = pd.concat(parts, ignore_index=True)
    write_csv(o.table, table)
    overview = summary(table)
    log.info("out-of-sample |error|:\n%s", overview.to_string())
    write_csv(o.summary, overview)
    devices = "; ".join(sorted({r["device"] for r in records if r.get("device")}))
    fidelity_figure(table, o.figure, devices)
