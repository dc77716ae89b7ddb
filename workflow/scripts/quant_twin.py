"""Stage 'twin' (quant comparison): spec -> resources/quants/{model}/{quant}.gguf from the model's F16 weights."""

from moeplace.model.twin import load_spec, make_twin
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage

with stage(snakemake.log[0]) as log:
    w, i, seed = snakemake.wildcards, snakemake.input, snakemake.params.seed
    make_twin(load_spec(i.spec), snakemake.output[0], "random", w.quant, seed, Build.read(i.llamacpp), snakemake.log[0])
    log.info("quantized the F16 twin of %s (seed %d) to %s", w.model, seed, w.quant)
