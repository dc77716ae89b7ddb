rule twin:
    input:
        unpack(get_twin_inputs),
    output:
        "resources/models/{model}.gguf",
    log:
        "logs/twin/{model}.log",
    conda:
        "../../environment.yml"
    params:
        weights=lambda wildcards: model_config(wildcards.model).weights,
        quant=lambda wildcards: model_config(wildcards.model).quant,
        seed=lambda wildcards: model_config(wildcards.model).seed,
    script:
        "../scripts/twin.py"


# The quant comparison: the same random F16 weights (same spec and seed give the same bytes) at another type.
rule quant_twin:
    input:
        spec=lambda wildcards: model_config(wildcards.model).twin,
        llamacpp=rules.llamacpp.output[0],
    output:
        "resources/quants/{model}/{quant}.gguf",
    log:
        "logs/twin/{model}.{quant}.log",
    conda:
        "../../environment.yml"
    params:
        seed=lambda wildcards: model_config(wildcards.model).seed,
    script:
        "../scripts/quant_twin.py"
