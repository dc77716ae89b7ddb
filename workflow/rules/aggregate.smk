rule aggregate:
    input:
        bench=get_context_bench,
        metadata=expand(rules.metadata.output[0], model=BENCH_MODELS),
        budget=expand(rules.budget.output[0], model=BENCH_MODELS),
    output:
        measured="results/tables/measured/{ctx}.csv",
        compare="results/tables/compare/{ctx}.csv",
        memory_check="results/tables/memory_check/{ctx}.csv",
    log:
        "logs/aggregate/{ctx}.log",
    conda:
        "../../environment.yml"
    params:
        models=BENCH_MODELS,
        bandwidths=params(SETTINGS.bandwidths),  # priors of what one context's runs cannot tell apart
    script:
        "../scripts/aggregate.py"


rule aggregate_table:
    input:
        measured=expand(rules.aggregate.output.measured, ctx=CONTEXTS),
        compare=expand(rules.aggregate.output.compare, ctx=CONTEXTS),
        memory_check=expand(rules.aggregate.output.memory_check, ctx=CONTEXTS),
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
        memory_check=report(
            "results/tables/memory_check.csv",
            caption="../report/memory_check.rst",
            category="Tables",
        ),
    log:
        "logs/aggregate/all.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/concat_tables.py"


rule precision:
    input:
        measured=rules.aggregate_table.output.measured,
        variants=expand(rules.placement_table.output.variants, ctx=CONTEXTS),
    output:
        report(
            "results/tables/precision.csv",
            caption="../report/precision.rst",
            category="Tables",
        ),
    log:
        "logs/aggregate/precision.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/precision.py"
