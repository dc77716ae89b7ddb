rule quants:
    input:
        quants=expand(
            "resources/quants/{model}/{quant}.gguf",
            model=QUANTS_MODEL,
            quant=SETTINGS.quants.types,
        ),
        llamacpp=rules.llamacpp.output[0],
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
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        model=QUANTS_MODEL,
        types=SETTINGS.quants.types,
        cap_pct=SETTINGS.quants.cap_pct,
        # the RAM tier's sweep: plenty of RAM, and this one cap without locking
        settings=params(
            replace(
                SETTINGS.ram_tier,
                caps_pct=(SETTINGS.quants.cap_pct,),
                lock_modes=("none",),
            )
        ),
    script:
        "../scripts/quants.py"
