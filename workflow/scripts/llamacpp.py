"""Stage 'llamacpp': the user's llama.cpp build, or the pinned one (cached per machine) -> manifest JSON."""

from pathlib import Path

from moeplace.runtime.llamacpp import provision
from moeplace.runtime.outputs import stage, write_json

with stage(snakemake.log[0]) as log:
    manifest = provision(snakemake.params.llamacpp, Path(snakemake.log[0]))
    log.info("llama.cpp %s (build %s) in %s", manifest["version"], manifest["build_number"], manifest["bin_dir"])
    write_json(snakemake.output[0], manifest)
