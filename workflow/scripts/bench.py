"""Stage 'bench': one model and context at each n_cpu_moe -> results/bench/{model}/{ctx}.jsonl (records, whatever
happened; as they are measured, in the side file beside it, which a rerun resumes from)."""

from pathlib import Path

from moeplace.core.config import BenchSettings, DeviceTarget
from moeplace.measure.bench import BenchJob, Rig, run_sweep
from moeplace.measure.sweep_records import check_sweep, side_file, values_that_fit, write_sweep
from moeplace.model.meta import read_metadata
from moeplace.runtime.build import Build
from moeplace.runtime.device import device_setup
from moeplace.runtime.outputs import stage

with stage(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    manifest = Build.read(snakemake.input.llamacpp)
    meta = read_metadata(snakemake.input.metadata)
    device = device_setup(DeviceTarget(**p.device), manifest)
    job = BenchJob(w.model, snakemake.input.model[0], meta.file_records(), p.ctx, p.n_cpu_moe[0])
    rig = Rig(BenchSettings(**p.settings), device, manifest, Path(snakemake.log[0]), Path.cwd())
    side = side_file(snakemake.output[0])
    records = run_sweep(job, p.n_cpu_moe, rig, side)
    check_sweep(records, values_that_fit(p.n_cpu_moe, snakemake.input.get("budget"), p.ctx), manifest)
    write_sweep(snakemake.output[0], records, side)
