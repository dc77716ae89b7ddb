rule llamacpp:
    output:
        "resources/llamacpp/llamacpp.json",
    log:
        "logs/llamacpp/llamacpp.log",
    conda:
        "../../environment.yml"
    threads: workflow.cores
    params:
        llamacpp=config["llamacpp"],
    script:
        "../scripts/llamacpp.py"
