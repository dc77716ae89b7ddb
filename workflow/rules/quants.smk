rule quants:
    input:
        quants=expand(
            "resources/quants/{model}/{quant}.gguf",
            model=QUANTS_MODEL,
            quant=config["quants"]["types"],
        ),
        llamacpp="resources/llamacpp/llamacpp.json",
    output:
        records=f"results/quants/{QUANTS_MODEL}.jsonl",
        table=report(
            "results/tables/quants.csv",
            caption="../report/quants.rst",
            category="Quant types",
        ),
        figure=report(
            f"results/figures/quants_{QUANTS_MODEL}.png",
            caption="../report/quants_figure.rst",
            category="Quant types",
        ),
    log:
        "logs/quants/quants.log",
    conda:
        "../../environment.yml"
    threads: config["bench"]["threads"]
    resources:
        bench_device=1,
    params:
        model=QUANTS_MODEL,
        types=config["quants"]["types"],
        cap_pct=config["quants"]["cap_pct"],
        ram_tier=config["ram_tier"],
        threads=config["bench"]["threads"],
    script:
        "../scripts/quants.py"
