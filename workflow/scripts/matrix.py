"""Stage 'tune' (all models x contexts): tuner results -> tune.csv, matrix.csv and the matrix heatmap."""

import pandas as pd

from moeplace.measure.tune import matrix_table
from moeplace.report.figures.matrix import matrix_figure
from moeplace.runtime.outputs import read_json, stage, write_csv

with stage(snakemake.log[0]) as log:
    tune = pd.DataFrame([read_json(path) for path in snakemake.input.tune])
    write_csv(snakemake.output.tune, tune)
    matrix = matrix_table(tune)
    write_csv(snakemake.output.matrix, matrix)
    matrix_figure(matrix, snakemake.output.figure)
    log.info("matrix of %d models x %d contexts", matrix.model.nunique(), matrix.ctx.nunique())
