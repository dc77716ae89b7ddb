rule twin_f16:
    input:
        spec=lambda wildcards: model_config(wildcards.model)["twin"],
    output:
        # Kept only until every quantization of it exists; remade (same seed, same bytes) when needed.
        temp("resources/f16/{model}.gguf"),
    log:
        "logs/twin/{model}.f16.log",
    conda:
        "../../environment.yml"
    params:
        seed=lambda wildcards: model_config(wildcards.model)["seed"],
    script:
        "../scripts/twin_f16.py"


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
        weights=lambda wildcards: model_config(wildcards.model)["weights"],
        quant=lambda wildcards: model_config(wildcards.model)["quant"],
    script:
        "../scripts/twin.py"


rule quant_twin:
    input:
        f16="resources/f16/{model}.gguf",
        llamacpp="resources/llamacpp/llamacpp.json",
    output:
        "resources/quants/{model}/{quant}.gguf",
    log:
        "logs/twin/{model}.{quant}.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/quant_twin.py"
