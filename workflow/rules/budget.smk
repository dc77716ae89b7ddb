checkpoint budget:
    input:
        metadata=rules.metadata.output[0],
    output:
        "results/tables/budget/{model}.csv",
    log:
        "logs/budget/{model}.log",
    conda:
        "../../environment.yml"
    params:
        memory=params(SETTINGS.memory),
        contexts=[c.tokens for c in SETTINGS.contexts],
        cache_type_k=config["cache_type_k"],
        cache_type_v=config["cache_type_v"],
    script:
        "../scripts/budget.py"
