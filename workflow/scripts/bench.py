"""Stage 'bench': one llama-bench run -> results/bench/{model}/{ctx}/ncmoe{n}.jsonl (records, whatever happened)."""

from pathlib import Path

from moeplace.core.config import BenchSettings, DeviceTarget
from moeplace.measure.bench import run_bench
from moeplace.runtime.device import device_setup
from moeplace.runtime.outputs import read_json, stage, write_jsonl

with stage(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    manifest = read_json(snakemake.input.llamacpp)
    meta = read_json(snakemake.input.metadata)
    device = device_setup(DeviceTarget(**p.device), manifest)
    records = run_bench(
        model_name=w.model,
        model_path=snakemake.input.model[0],
        model_files=meta["files"],
        ctx=p.ctx,
        n_cpu_moe=int(w.n),
        settings=BenchSettings(**p.settings),
        device=device,
        manifest=manifest,
        log_path=Path(snakemake.log[0]),
        workdir=Path.cwd(),
    )
    write_jsonl(snakemake.output[0], records)
