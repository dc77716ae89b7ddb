rule llamacpp:
    output:
        "resources/llamacpp/llamacpp.json",
    log:
        "logs/llamacpp/llamacpp.log",
    conda:
        "../../environment.yml"
    params:
        llamacpp=params(SETTINGS.llamacpp),
        cache_layout=LLAMACPP_CACHE_LAYOUT,  # a new layout of the cached build makes a new manifest
    script:
        "../scripts/llamacpp.py"


# Our own tools (the routing tracer) link against a CPU-only pinned build, whatever build the
# benchmarks run on: routing does not depend on the backend, and a GPU backend's static library
# would need the vendor's runtime libraries at link time.
use rule llamacpp as llamacpp_tools with:
    output:
        "resources/llamacpp/tools.json",
    log:
        "logs/llamacpp/tools.log",
    params:
        llamacpp=params(replace(SETTINGS.llamacpp, bin_dir=None, cmake_options=[])),
        cache_layout=LLAMACPP_CACHE_LAYOUT,
