"""Stage 'tune': real probes for the lowest feasible n at one context -> results/tune/{model}/ctx{ctx}.json."""

from pathlib import Path

import pandas as pd

from moeplace.bench import device_setup
from moeplace.metadata import inspect_model
from moeplace.outputs import read_json, stage, write_json
from moeplace.tune import tune, tune_record
from moeplace.units import parse_size

with stage(snakemake.log[0]) as log:  # noqa: F821 - injected by Snakemake
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards  # noqa: F821
    ctx, manifest, model = int(w.ctx), read_json(i.llamacpp), i.model[0]
    row = pd.read_csv(i.budget).set_index("ctx").loc[ctx]
    n_layer = inspect_model(model)["n_layer"]
    predicted = int(row.n_cpu_moe) if row.status == "ok" else n_layer
    device = device_setup(p.device["kind"], p.device["name"], parse_size(p.device["vram"], "device.vram"), manifest)
    result = tune(model, ctx, device, manifest, n_layer, predicted, Path(snakemake.log[0]), Path.cwd(),  # noqa: F821
                  p.tune["margin"], p.threads, p.tune["timeout_s"], p.cache_type_k, p.cache_type_v)
    record = tune_record(w.model, ctx, result, device.label, p.tune["margin"])
    log.info("tuned: %s", record)
    write_json(snakemake.output[0], record)  # noqa: F821
