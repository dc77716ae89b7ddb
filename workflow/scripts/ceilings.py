"""Stage 'ceilings': this host's measured ceilings -> results/tables/ceilings.csv."""

from pathlib import Path

from moeplace.bench import device_setup
from moeplace.ceilings import measure_ceilings
from moeplace.metadata import inspect_model
from moeplace.outputs import read_json, stage, write_csv
from moeplace.units import parse_size

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    manifest = read_json(i.llamacpp)
    device = device_setup(p.device["kind"], p.device["name"], parse_size(p.device["vram"], "device.vram"), manifest)
    models = {m: (Path(i[f"model_{m}"][0]), read_json(i[f"metadata_{m}"])) for m in p.models}
    table = measure_ceilings(
        manifest=manifest,
        dense=(Path(i.dense), inspect_model(i.dense)),
        models=models,
        device=device,
        threads=p.threads,
        ram_bytes=parse_size(p.ceilings["ram_probe"], "ceilings.ram_probe"),
        seconds=p.ceilings["seconds"],
        random_block=p.random_kib * 1024,
        gen=p.ceilings["gen"],
        repetitions=p.ceilings["repetitions"],
        log_file=Path(snakemake.log[0]),
    )
    log.info("ceilings:\n%s", table.to_string())
    write_csv(snakemake.output[0], table)
