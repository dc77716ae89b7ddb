"""Stage 'tune': real probes for the lowest feasible n at one context and KV type -> results/tune/....json."""

from pathlib import Path

from moeplace.bench import device_setup
from moeplace.budget import Device, plan
from moeplace.outputs import read_json, stage, write_json
from moeplace.tune import tune, tune_record
from moeplace.units import parse_size

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    ctx, kv, manifest, meta = int(w.ctx), w.kv, read_json(i.llamacpp), read_json(i.metadata)
    vram = parse_size(p.device["vram"], "device.vram")
    predicted = plan(meta, Device(vram, parse_size(p.device["overhead"], "device.overhead")), ctx, kv, kv)["n_cpu_moe"]
    device = device_setup(p.device["kind"], p.device["name"], vram, manifest)
    start = meta["n_layer"] if predicted is None else predicted
    result = tune(
        i.model[0],
        ctx,
        device,
        manifest,
        meta["n_layer"],
        start,
        Path(snakemake.log[0]),
        Path.cwd(),
        p.tune["margin"],
        p.threads,
        p.tune["timeout_s"],
        kv,
        kv,
    )
    record = {**tune_record(w.model, ctx, result, device.label, p.tune["margin"]), "cache_type": kv}
    log.info("tuned: %s", record)
    write_json(snakemake.output[0], record)
