"""Stage 'figures' (rule figure_ncmoe): one context's aggregate tables -> results/figures/ncmoe_{ctx}.png
and ncmoe_{ctx}_pp.png."""

import pandas as pd

from moeplace.report.figures.ncmoe import ncmoe_figure
from moeplace.runtime.outputs import stage

with stage(snakemake.log[0]) as log:
    i, o, p = snakemake.input, snakemake.output, snakemake.params
    measured, compare = pd.read_csv(i.measured), pd.read_csv(i.compare)
    ncmoe_figure(compare, measured, p.ctx, "tg", o.tg)
    ncmoe_figure(compare, measured, p.ctx, "pp", o.pp)
    log.info("figures for context %d: %s, %s", p.ctx, o.tg, o.pp)
