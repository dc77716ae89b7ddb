rule bench:
    input:
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        llamacpp=rules.llamacpp.output[0],
        budget=get_sweep_budget,
    output:
        "results/bench/{model}/{ctx}.jsonl",
    log:
        "logs/bench/{model}/{ctx}.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        settings=params(SETTINGS.bench),
        device=params(SETTINGS.device),
        ctx=ctx_tokens,
        n_cpu_moe=get_sweep_values,
    script:
        "../scripts/bench.py"
