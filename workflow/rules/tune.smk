rule tune:
    input:
        model=get_model_gguf,
        metadata="results/metadata/{model}.json",
        llamacpp="resources/llamacpp/llamacpp.json",
    output:
        "results/tune/{model}/ctx{ctx}_kv{kv}.json",
    log:
        "logs/tune/{model}/ctx{ctx}_kv{kv}.log",
    conda:
        "../../environment.yml"
    threads: config["bench"]["threads"]
    resources:
        bench_device=1,
    params:
        device=config["device"],
        tune=config["tune"],
        threads=config["bench"]["threads"],
        cache_type_k=config["cache_type_k"],
        cache_type_v=config["cache_type_v"],
    script:
        "../scripts/tune.py"


rule matrix:
    input:
        tune=expand(
            "results/tune/{model}/ctx{ctx}_kv{kv}.json",
            model=BENCH_MODELS,
            ctx=config["contexts"],
            kv=config["tune"]["cache_types"],
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
