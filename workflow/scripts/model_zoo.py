"""Stage 'model_zoo': config/models/*.yaml -> results/tables/model_zoo.csv and results/model_zoo.md (README's table)."""

from pathlib import Path

from moeplace.model.model_zoo import markdown, zoo_table
from moeplace.runtime.outputs import stage, write_csv, write_text

with stage(snakemake.log[0]) as log:
    table = zoo_table([Path(p) for p in snakemake.input.specs])
    log.info("model zoo: %d full-size MoE specs", len(table))
    write_csv(snakemake.output.table, table)
    write_text(snakemake.output.markdown, markdown(table))
