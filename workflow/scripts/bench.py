"""Stage 'bench': one llama-bench run -> results/bench/{model}/ctx{ctx}/ncmoe{n}.jsonl (records, whatever happened)."""

from pathlib import Path

from moeplace.bench import BenchSettings, device_setup, run_bench
from moeplace.outputs import read_json, stage, write_jsonl
from moeplace.units import parse_size

with stage(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    manifest = read_json(snakemake.input.llamacpp)
    meta = read_json(snakemake.input.metadata)
    device = device_setup(p.device["kind"], p.device["name"], parse_size(p.device["vram"], "device.vram"), manifest)
    records = run_bench(
        model_name=w.model,
        model_path=snakemake.input.model[0],
        model_files=meta["files"],
        ctx=int(w.ctx),
        n_cpu_moe=int(w.n),
        settings=BenchSettings(**p.settings),
        device=device,
        manifest=manifest,
        log_path=Path(snakemake.log[0]),
        workdir=Path.cwd(),
    )
    write_jsonl(snakemake.output[0], records)
