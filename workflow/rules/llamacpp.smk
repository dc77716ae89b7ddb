rule llamacpp:
    output:
        "resources/llamacpp/llamacpp.json",
    log:
        "logs/llamacpp/llamacpp.log",
    conda:
        "../../environment.yml"
    params:
        llamacpp=config["llamacpp"],
        cache_layout=LLAMACPP_CACHE_LAYOUT,  # a new layout of the cached build makes a new manifest
    script:
        "../scripts/llamacpp.py"


# Our own tools (the routing tracer) link against the pinned source, whatever build benchmarks run on.
use rule llamacpp as llamacpp_pinned with:
    output:
        "resources/llamacpp/pinned.json",
    log:
        "logs/llamacpp/pinned.log",
    params:
        llamacpp={**config["llamacpp"], "bin_dir": None},
