"""Stage 'ceilings': this host's measured ceilings -> results/tables/ceilings.csv."""

from pathlib import Path

from moeplace.core.config import BenchSettings, CeilingsSettings, DeviceTarget
from moeplace.measure.ceilings import measure_ceilings
from moeplace.model.meta import read_metadata
from moeplace.model.metadata import inspect_model
from moeplace.runtime.build import Build
from moeplace.runtime.device import device_setup
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    manifest = Build.read(i.llamacpp)
    device = device_setup(DeviceTarget(**p.device), manifest)
    models = {m: (Path(i[f"model_{m}"][0]), read_metadata(i[f"metadata_{m}"])) for m in p.models}
    table = measure_ceilings(
        manifest=manifest,
        dense=(Path(i.dense), inspect_model(i.dense)),
        models=models,
        device=device,
        settings=CeilingsSettings(**p.ceilings),
        bench=BenchSettings(**p.bench),
        log_file=Path(snakemake.log[0]),
    )
    log.info("ceilings:\n%s", table.to_string())
    write_csv(snakemake.output[0], table)
