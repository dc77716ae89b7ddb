rule bench:
    input:
        model=get_model_gguf,
        metadata="results/metadata/{model}.json",
        llamacpp="resources/llamacpp/llamacpp.json",
    output:
        "results/bench/{model}/ctx{ctx}/ncmoe{n}.jsonl",
    log:
        "logs/bench/{model}/ctx{ctx}/ncmoe{n}.log",
    conda:
        "../../environment.yml"
    threads: config["bench"]["threads"]
    resources:
        bench_device=1,
    params:
        settings=get_bench_settings(),
        device=config["device"],
    script:
        "../scripts/bench.py"
