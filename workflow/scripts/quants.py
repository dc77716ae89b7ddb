"""Stage 'quants': one twin at several quant types -> records JSONL, quants.csv, figure."""

from pathlib import Path

from moeplace.core.config import RamTierSettings
from moeplace.measure.quants import quant_row, quants_table
from moeplace.measure.ram_tier import run_ram_tier
from moeplace.model.metadata import inspect_model
from moeplace.report.figures.quants import quants_figure
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_csv, write_jsonl

with stage(snakemake.log[0]) as log:
    i, o, p = snakemake.input, snakemake.output, snakemake.params
    manifest = Build.read(i.llamacpp)
    rows, all_records = [], []
    for quant, path in zip(p.types, i.quants):
        meta = inspect_model(path)
        records = run_ram_tier(
            model_name=f"{p.model} {quant}",
            model_path=path,
            meta=meta,
            manifest=manifest,
            settings=RamTierSettings(**p.settings),
            log_path=Path(snakemake.log[0]),
            workdir=Path.cwd(),
        )
        all_records += [{**rec, "quant": quant} for rec in records]
        rows.append(quant_row(quant, meta, records, p.cap_pct))
    table = quants_table(rows).assign(model=p.model)
    log.info("quant comparison:\n%s", table.to_string())
    write_jsonl(o.records, all_records)
    write_csv(o.table, table)
    quants_figure(table, o.figure, f"{p.model}: quant types, bytes per token vs decode speed (CPU)")
