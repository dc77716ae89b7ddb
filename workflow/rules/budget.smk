checkpoint budget:
    input:
        unpack(get_budget_inputs),
    output:
        "results/tables/budget/{model}.csv",
    log:
        "logs/budget/{model}.log",
    conda:
        "../../environment.yml"
    params:
        memory=params(SETTINGS.memory),
        device=params(SETTINGS.device),
        contexts=[c.tokens for c in SETTINGS.contexts],
        cache_type_k=SETTINGS.bench.type_k,
        cache_type_v=SETTINGS.bench.type_v,
        ubatch=SETTINGS.bench.ubatch,
        flash_attn=SETTINGS.bench.flash_attn,
    script:
        "../scripts/budget.py"
