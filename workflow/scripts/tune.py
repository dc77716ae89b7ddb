"""Stage 'tune': real probes for the lowest feasible n at one context and KV type -> results/tune/....json."""

from pathlib import Path

from moeplace.core.config import Device, DeviceTarget, TuneSettings
from moeplace.measure.tune import Probing, tune_model
from moeplace.model.memory import Workload
from moeplace.model.meta import read_metadata
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_json

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    _, record = tune_model(
        model_name=w.model,
        model_path=i.model[0],
        meta=read_metadata(i.metadata),
        workload=Workload(p.ctx, p.ubatch, p.flash_attn, w.kv, w.kv),
        target=DeviceTarget(**p.device),
        memory=Device(**p.memory),
        probing=Probing(TuneSettings(**p.tune), Build.read(i.llamacpp), Path(snakemake.log[0]), Path.cwd()),
    )
    log.info("tuned: %s", record)
    write_json(snakemake.output[0], record)
