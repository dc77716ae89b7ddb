"""Stage 'budget_check' (all models): per-model grids -> results/tables/budget_check.csv and its figure."""

import pandas as pd

from moeplace.measure.budget_check import check_table, devices_summary, devices_table, summary
from moeplace.report.figures.budget_check import budget_check_figure, devices_figure
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    table = pd.concat([pd.read_csv(path) for path in snakemake.input], ignore_index=True)
    if "caps_mib" in table:  # several devices: the per-device plan against each device's logged buffers
        table = devices_table(table.to_dict("records"))
        write_csv(snakemake.output.table, table)
        devices_figure(table, snakemake.output.figure)
        log.info("budget check over several devices: %s", devices_summary(table))
    else:
        table = check_table(table.to_dict("records"))
        write_csv(snakemake.output.table, table)
        device = table.device.dropna().iloc[0] if table.device.notna().any() else "the device"
        budget_check_figure(table, snakemake.output.figure, device)
        log.info("budget check: %s", summary(table))
