"""Stage 'ram_tier': CPU decode under RAM caps -> records JSONL, table (with the disk-term prediction), figure."""

from pathlib import Path

import pandas as pd

from moeplace.core.config import RamTierSettings
from moeplace.measure.ram_tier import run_ram_tier
from moeplace.measure.ram_tier_table import predicted_column, ram_tier_table
from moeplace.model.meta import read_metadata
from moeplace.plan.measured_prior import measured_bandwidths
from moeplace.report.figures.ram_tier import ram_tier_figure
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_csv, write_jsonl

with stage(snakemake.log[0]) as log:
    i, o, p, w = snakemake.input, snakemake.output, snakemake.params, snakemake.wildcards
    meta = read_metadata(i.metadata)
    records = run_ram_tier(
        model_name=w.model,
        model_path=i.model[0],
        meta=meta,
        manifest=Build.read(i.llamacpp),
        settings=RamTierSettings(**p.settings),
        log_path=Path(snakemake.log[0]),
        workdir=Path.cwd(),
    )
    table = ram_tier_table(records)
    if "ceilings" in i.keys():
        bw = measured_bandwidths(pd.read_csv(i.ceilings))
        table = predicted_column(table, meta, bw.get("bw_ddr_gbps"), bw.get("bw_disk_gbps"))
    log.info("RAM tier of %s:\n%s", w.model, table.to_string())
    write_jsonl(o.records, records)
    write_csv(o.table, table)
    ram_tier_figure(table, o.figure, f"{w.model}: decode on the CPU with RAM smaller than the model")
