"""Stage 'twin': architecture spec -> resources/models/{model}.gguf (sparse, or random and quantized)."""

from moeplace.model.twin import load_spec, make_twin
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage

with stage(snakemake.log[0]) as log:
    p = snakemake.params
    llamacpp = Build.read(snakemake.input.llamacpp) if p.weights == "random" else None
    spec = load_spec(snakemake.input.spec)
    make_twin(spec, snakemake.output[0], p.weights, p.quant, p.seed, llamacpp, snakemake.log[0])
    quant = p.quant if p.weights == "random" else spec.ftype
    log.info("wrote %s twin of %s (%s weights)", quant, spec.name, p.weights)
