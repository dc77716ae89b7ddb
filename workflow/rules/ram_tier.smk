rule ram_tier:
    input:
        unpack(get_ceilings_table),
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        llamacpp=rules.llamacpp.output[0],
    output:
        records="results/ram_tier/{model}.jsonl",
        table="results/tables/ram_tier/{model}.csv",
        figure=report(
            "results/figures/ram_tier_{model}.png",
            caption="../report/ram_tier.rst",
            category="RAM tier",
        ),
    log:
        "logs/ram_tier/{model}.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        settings=params(SETTINGS.ram_tier),
    script:
        "../scripts/ram_tier.py"


rule ram_tier_table:
    input:
        ram_tier=expand(rules.ram_tier.output.table, model=RAM_TIER_MODELS),
    output:
        ram_tier=report(
            "results/tables/ram_tier.csv",
            caption="../report/ram_tier_table.rst",
            category="RAM tier",
        ),
    log:
        "logs/ram_tier/all.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/concat_tables.py"
