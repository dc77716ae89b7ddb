"""Stage 'placement' (its figure, one context): variants table -> results/figures/variants_{ctx}.png."""

import pandas as pd

from moeplace.report.figures.variants import variants_figure
from moeplace.runtime.outputs import stage

with stage(snakemake.log[0]) as log:
    variants_figure(pd.read_csv(snakemake.input.variants), snakemake.params.ctx, snakemake.output[0])
    log.info("wrote %s", snakemake.output[0])
