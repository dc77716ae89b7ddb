"""Stage 'placement' (one model, context and variant): the variant's llama-bench run, interleaved with -ncmoe at
the same host bytes -> results/variants/{model}/{ctx}/{variant}.jsonl."""

from pathlib import Path

import pandas as pd

from moeplace.core.config import BenchSettings, DeviceTarget
from moeplace.measure.bench import BenchJob, Rig
from moeplace.measure.placement import run_variant, variant_n
from moeplace.model.meta import read_metadata
from moeplace.runtime.build import Build
from moeplace.runtime.device import device_setup
from moeplace.runtime.outputs import stage, write_jsonl

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    manifest, meta, ctx = Build.read(i.llamacpp), read_metadata(i.metadata), p.ctx
    row = pd.read_csv(i.budget).set_index("ctx").loc[ctx]
    device = device_setup(DeviceTarget(**p.device), manifest)
    n = variant_n(meta, int(row.n_cpu_moe) if row.status == "ok" else None, bool(device.other_caps))
    job = BenchJob(w.model, i.model[0], meta.file_records(), ctx, n)
    rig = Rig(BenchSettings(**p.settings), device, manifest, Path(snakemake.log[0]), Path.cwd())
    records = run_variant(w.variant, meta, n, row.to_dict(), job, rig)
    log.info("%s at n=%d: placement %s", w.variant, n, "matches" if records[0]["placement_match"] else "DIFFERS")
    write_jsonl(snakemake.output[0], records)
