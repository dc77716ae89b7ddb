"""Stage 'tune_placement': the placements the speed model cannot tell apart at one context, raced on the device
(moeplace tune --placement optimal) -> results/tune/{model}/{ctx}_placement.json."""

from pathlib import Path

from moeplace.core.config import Bandwidths, DeviceTarget, TuneSettings
from moeplace.measure.contenders import race_record, tune_placements
from moeplace.measure.tune import Probing
from moeplace.model.meta import read_metadata
from moeplace.plan.request import Request
from moeplace.plan.speed import prior
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_json

with stage(snakemake.log[0]) as log:
    i, p, w = snakemake.input, snakemake.params, snakemake.wildcards
    target = DeviceTarget(**p.device)
    request = Request(
        (p.ctx,),
        i.model[0],
        vram=(f"{target.vram_bytes}B",) if target.vram_bytes else None,  # None: the GPU's free memory
        auto=target.vram_bytes is None,
        ubatch=p.ubatch,
        flash_attn=p.flash_attn,
        emit="bench",
        placement="optimal",
    )
    probing = Probing(TuneSettings(**p.tune), Build.read(i.llamacpp), Path(snakemake.log[0]), Path.cwd())
    model = prior(Bandwidths(**p.bandwidths))  # the config's bandwidths: decode before any run
    found = tune_placements(read_metadata(i.metadata), i.model[0], request, p.ctx, target, probing, model)
    record = race_record(found, w.model, p.ctx, request)
    log.info("raced: %s", record)
    write_json(snakemake.output[0], record)
