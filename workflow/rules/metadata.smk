rule metadata:
    input:
        gguf=get_model_gguf,
    output:
        "results/metadata/{model}.json",
    log:
        "logs/metadata/{model}.log",
    conda:
        "../../environment.yml"
    params:
        constants=lambda wildcards: model_config(wildcards.model).constants,
    script:
        "../scripts/metadata.py"
