"""Stage 'tune' (all models x contexts): tuner results -> tune.csv, matrix.csv and the matrix heatmap."""

import pandas as pd

from moeplace.figures import matrix_figure
from moeplace.outputs import read_json, stage, write_csv
from moeplace.tune import matrix_table

with stage(snakemake.log[0]) as log:  # noqa: F821 - injected by Snakemake
    tune = pd.DataFrame([read_json(path) for path in snakemake.input.tune])  # noqa: F821
    write_csv(snakemake.output.tune, tune)  # noqa: F821
    matrix = matrix_table(tune)
    write_csv(snakemake.output.matrix, matrix)  # noqa: F821
    matrix_figure(matrix, snakemake.output.figure)  # noqa: F821
    log.info("matrix of %d models x %d contexts", matrix.model.nunique(), matrix.ctx.nunique())
