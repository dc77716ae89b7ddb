rule bench:
    input:
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        llamacpp=rules.llamacpp.output[0],
    output:
        "results/bench/{model}/{ctx}/ncmoe{n}.jsonl",
    log:
        "logs/bench/{model}/{ctx}/ncmoe{n}.log",
    conda:
        "../../environment.yml"
    threads: config["bench"]["threads"]
    resources:
        bench_device=1,
    params:
        settings=params(SETTINGS.bench),
        device=params(SETTINGS.device),
        ctx=ctx_tokens,
    script:
        "../scripts/bench.py"
