"""Stage 'bench': one llama-bench run -> results/bench/{model}/ctx{ctx}/ncmoe{n}.jsonl (records, whatever happened)."""

from pathlib import Path

from moeplace.bench import BenchSettings, device_setup, run_bench
from moeplace.outputs import read_json, stage, write_jsonl
from moeplace.units import parse_size

with stage(snakemake.log[0]) as log:  # noqa: F821 - injected by Snakemake
    w, p = snakemake.wildcards, snakemake.params  # noqa: F821
    manifest = read_json(snakemake.input.llamacpp)  # noqa: F821
    meta = read_json(snakemake.input.metadata)  # noqa: F821
    device = device_setup(p.device["kind"], p.device["name"], parse_size(p.device["vram"], "device.vram"), manifest)
    records = run_bench(model_name=w.model, model_path=snakemake.input.model[0], model_files=meta["files"],  # noqa: F821
                        ctx=int(w.ctx), n_cpu_moe=int(w.n), settings=BenchSettings(**p.settings), device=device,
                        manifest=manifest, log_path=Path(snakemake.log[0]), workdir=Path.cwd())  # noqa: F821
    write_jsonl(snakemake.output[0], records)  # noqa: F821
