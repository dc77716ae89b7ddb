rule tune:
    input:
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        llamacpp=rules.llamacpp.output[0],
    output:
        "results/tune/{model}/{ctx}_kv{kv}.json",
    log:
        "logs/tune/{model}/{ctx}_kv{kv}.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        device=params(SETTINGS.device),
        memory=params(SETTINGS.memory),
        tune=params(SETTINGS.tune),
        ctx=ctx_tokens,
        ubatch=SETTINGS.bench.ubatch,
        flash_attn=SETTINGS.bench.flash_attn,
    script:
        "../scripts/tune.py"


rule matrix:
    input:
        tune=expand(
            rules.tune.output[0],
            model=BENCH_MODELS,
            ctx=CONTEXTS,
            kv=SETTINGS.tune_cache_types,
        ),
    output:
        tune=report(
            "results/tables/tune.csv", caption="../report/tune.rst", category="Tables"
        ),
        matrix=report(
            "results/tables/matrix.csv",
            caption="../report/matrix.rst",
            category="Tables",
        ),
        figure=report(
            "results/figures/matrix.png",
            caption="../report/matrix.rst",
            category="Figures",
        ),
    log:
        "logs/tune/matrix.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/matrix.py"


rule tune_placement:
    input:
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        llamacpp=rules.llamacpp.output[0],
    output:
        "results/tune/{model}/{ctx}_placement.json",
    log:
        "logs/tune/{model}/{ctx}_placement.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        device=params(SETTINGS.device),
        tune=params(SETTINGS.tune),
        bandwidths=params(SETTINGS.bandwidths),
        ctx=ctx_tokens,
        ubatch=SETTINGS.bench.ubatch,
        flash_attn=SETTINGS.bench.flash_attn,
    script:
        "../scripts/tune_placement.py"
