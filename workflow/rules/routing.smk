rule routing:
    input:
        model=get_model_gguf,
        llamacpp=get_tools_manifest(),
        prompt=SETTINGS.routing.prompt,
    output:
        trace="results/routing/{model}.npz",
        table="results/tables/routing/{model}.csv",
        figure=report(
            "results/figures/routing_{model}.png",
            caption="../report/routing.rst",
            category="Routing",
        ),
    log:
        "logs/routing/{model}.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,  # not a measurement, but it would disturb one running beside it
    params:
        gen=SETTINGS.routing.gen,
        timeout_s=SETTINGS.routing.timeout_s,
        twin=lambda wildcards: model_config(wildcards.model).twin is not None,
    script:
        "../scripts/routing.py"


rule routing_table:
    input:
        routing=expand(rules.routing.output.table, model=ROUTING_MODELS),
    output:
        routing=report(
            "results/tables/routing.csv",
            caption="../report/routing_table.rst",
            category="Routing",
        ),
    log:
        "logs/routing/all.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/concat_tables.py"
