"""Stage 'llamacpp': the user's llama.cpp build, or the pinned one (cached per machine) -> manifest JSON."""

from pathlib import Path

from moeplace.core.config import LlamacppSettings
from moeplace.runtime.llamacpp import provision
from moeplace.runtime.outputs import stage, write_json

with stage(snakemake.log[0]) as log:
    build = provision(LlamacppSettings(**snakemake.params.llamacpp), Path(snakemake.log[0]))
    log.info("llama.cpp %s (build %s) in %s", build.version, build.build_number, build.bin_dir)
    write_json(snakemake.output[0], build.to_json())
