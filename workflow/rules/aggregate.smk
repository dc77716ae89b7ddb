rule aggregate_context:
    input:
        bench=get_context_bench,
        metadata=expand("results/metadata/{model}.json", model=BENCH_MODELS),
        predicted=expand("results/tables/predicted/{model}.csv", model=BENCH_MODELS),
        budget=expand("results/tables/budget/{model}.csv", model=BENCH_MODELS),
    output:
        measured="results/tables/measured/ctx{ctx}.csv",
        compare="results/tables/compare/ctx{ctx}.csv",
        kv_check="results/tables/kv_check/ctx{ctx}.csv",
    log:
        "logs/aggregate/ctx{ctx}.log",
    conda:
        "../../environment.yml"
    params:
        models=BENCH_MODELS,
    script:
        "../scripts/aggregate.py"


rule aggregate:
    input:
        measured=expand("results/tables/measured/ctx{ctx}.csv", ctx=config["contexts"]),
        compare=expand("results/tables/compare/ctx{ctx}.csv", ctx=config["contexts"]),
        kv_check=expand("results/tables/kv_check/ctx{ctx}.csv", ctx=config["contexts"]),
    output:
        measured=report(
            "results/tables/measured.csv",
            caption="../report/measured.rst",
            category="Tables",
        ),
        compare=report(
            "results/tables/compare.csv",
            caption="../report/compare.rst",
            category="Tables",
        ),
        kv_check=report(
            "results/tables/kv_check.csv",
            caption="../report/kv_check.rst",
            category="Tables",
        ),
    log:
        "logs/aggregate/all.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/concat_tables.py"
