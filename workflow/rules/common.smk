import os
import sys
from dataclasses import replace
from pathlib import Path

from moeplace.core.config import params, parse_settings, validate_config
from moeplace.core.errors import MoeplaceError
from moeplace.model.gguf_file import shard_paths
from moeplace.model.kvcache import CACHE_TYPES
from moeplace.measure.placement import DEVICE_VARIANTS, VARIANTS
from moeplace.runtime.llamacpp import LAYOUT as LLAMACPP_CACHE_LAYOUT
from moeplace.runtime.llamacpp_args import refusal
from moeplace.runtime.locks import clear_stale_locks
from moeplace.runtime.model_ref import resolve_local
from moeplace.model.twin import load_spec


def stop(message):
    """End the run before any job with one line naming the problem, no traceback."""
    sys.exit(f"moeplace: {message}")


try:
    validate_config(config, workflow.source_path("../schemas/config.schema.yaml"))
    SETTINGS = parse_settings(config)
except MoeplaceError as e:
    stop(e)
# Every stage runs the top-level KV cache and flash attention: if llama.cpp refuses them, nothing would load.
# (The grids of budget_check and tune record a cell it refuses as "unsupported" instead.)
if refused := refusal(config["flash_attn"], config["cache_type_v"]):
    stop(
        f"config cache_type_v/flash_attn: {refused}; set flash_attn to on or auto, or cache_type_v to f16."
    )
# Over several devices (device.vram a list) the placement variants are those that place across them.
RUN_VARIANTS = DEVICE_VARIANTS if SETTINGS.device.other_vram_bytes else VARIANTS
# Each context's one label ("32k"), used in every path, table name and title.
CONTEXTS = {c.label: c for c in SETTINGS.contexts}
for name, m in config["models"].items():
    if "gguf" in m:  # ollama:, lmstudio: and hf: references become the file they name
        try:
            m["gguf"] = resolve_local(m["gguf"])
        except MoeplaceError as e:
            stop(f"config models.{name}.gguf: {e}")
    for key in ("gguf", "twin"):
        if key in m and not Path(m[key]).exists():
            stop(
                f"config models.{name}.{key}: {m[key]} does not exist; fix the path (relative to {Path.cwd()})."
            )
if any("constants" not in m for m in config["models"].values()):
    too_short = [
        c
        for c in config["contexts"]
        if c <= config["bench"]["prompt"] + config["bench"]["gen"]
    ]
    if too_short:
        stop(
            f"config contexts: {too_short} leave no room for bench.prompt + bench.gen "
            f"({config['bench']['prompt']} + {config['bench']['gen']}); use longer contexts or shorter tests."
        )


def layer_count(model):
    """Layers of a model before any job runs: from its twin spec or its GGUF header."""
    from moeplace.model.metadata import inspect_model
    from moeplace.model.twin import load_spec

    m = config["models"][model]
    try:
        return (
            load_spec(m["twin"]).n_layer
            if "twin" in m
            else inspect_model(m["gguf"]).n_layer
        )
    except MoeplaceError as e:
        stop(f"config models.{model}: {e}")


if config["bench"]["n_cpu_moe"] != "auto":
    for name, m in config["models"].items():
        if "constants" not in m and m["bench"]:
            n_layer = layer_count(name)
            outside = sorted(
                n for n in set(config["bench"]["n_cpu_moe"]) if n > n_layer
            )
            if outside:
                stop(
                    f"config bench.n_cpu_moe: {outside} exceed {name}'s {n_layer} layers; use values 0..{n_layer}."
                )
# Only the main process may clear a killed run's locks; a job's own parse (e.g. on a cluster node) never does.
clear_stale_locks(Path.cwd(), workflow.is_main_process)
for folder in ("results", "logs", "resources"):
    if Path(folder).exists() and not os.access(folder, os.W_OK):
        stop(
            f"{Path(folder).resolve()} is not writable; fix its permissions or run from another directory."
        )


wildcard_constraints:
    model="[A-Za-z0-9][A-Za-z0-9._-]*",
    ctx="|".join(CONTEXTS),
    variant="|".join(RUN_VARIANTS),
    kv="|".join(CACHE_TYPES),
    quant="[A-Za-z0-9_]+",


MODELS = list(config["models"])


def model_config(model):
    return config["models"][model]


def model_files(model):
    """The GGUF file(s) a model is read from: the user's file (all shards) or its twin."""
    m = model_config(model)
    if "gguf" in m:
        try:
            return [str(p) for p in shard_paths(Path(m["gguf"]))]
        except MoeplaceError as e:
            stop(f"config models.{model}.gguf: {e}")
    if "twin" in m:
        return [rules.twin.output[0].format(model=model)]
    return []


def get_model_gguf(wildcards):
    return model_files(wildcards.model)


def metadata_path(model):
    return rules.metadata.output[0].format(model=model)


def ctx_tokens(wildcards):
    """The context of a job, in tokens, from its {ctx} label."""
    return CONTEXTS[wildcards.ctx].tokens


def get_budget_inputs(wildcards):
    """A model with tensors gets its compute buffers from llama.cpp's own reserve; the seed's constants do not."""
    inputs = {"metadata": metadata_path(wildcards.model)}
    if model_files(wildcards.model):
        inputs |= {
            "model": model_files(wildcards.model),
            "llamacpp": rules.llamacpp.output[0],
        }
    return inputs


def get_ceilings_table(wildcards):
    """The ceilings table where that stage runs: its measured bandwidths fill the speed model's priors and the
    RAM tier's predicted column."""
    return {"ceilings": rules.ceilings.output[0]} if CEILINGS else {}


def get_ceilings_inputs(wildcards):
    """Every benchmarked model's file and metadata, named per model."""
    inputs = {}
    for model in WEIGHT_MODELS:
        inputs[f"model_{model}"] = model_files(model)
        inputs[f"metadata_{model}"] = metadata_path(model)
    return inputs


def get_final_outputs():
    outputs = [
        path.format(model=m)
        for m in MODELS
        for path in (
            rules.metadata.output[0],
            rules.predict.output[0],
            rules.budget.output[0],
        )
    ]
    if BENCH_MODELS:
        outputs += [
            rules.aggregate_table.output.measured,
            rules.aggregate_table.output.compare,
        ]
        outputs.append(rules.precision.output[0])
        outputs += [rules.calibrate.output[0].format(model=m) for m in BENCH_MODELS]
        outputs += [rules.fidelity.output.table, rules.fidelity.output.figure]
        outputs += [
            rules.figure_ncmoe.output.tg.format(ctx=label) for label in CONTEXTS
        ]
        outputs += [rules.matrix.output.matrix, rules.matrix.output.figure]
        outputs += [
            rules.figure_variants.output[0].format(ctx=label) for label in CONTEXTS
        ]
    if CEILINGS:
        outputs.append(rules.ceilings.output[0])
    if RAM_TIER_MODELS:
        outputs.append(rules.ram_tier_table.output.ram_tier)
        outputs += [
            rules.ram_tier.output.figure.format(model=m) for m in RAM_TIER_MODELS
        ]
    if QUANTS:
        outputs += [rules.quants.output.table, rules.quants.output.figure]
    if ROUTING_MODELS:
        outputs.append(rules.routing_table.output.routing)
        outputs += [rules.routing.output.figure.format(model=m) for m in ROUTING_MODELS]
    return outputs


def get_zoo_specs(wildcards):
    """Every model spec: the zoo table summarises the full-size ones and notes which architectures have tiny ones."""
    return sorted(str(p) for p in Path("config/models").glob("*.yaml"))


def get_twin_inputs(wildcards):
    m = model_config(wildcards.model)
    inputs = {"spec": m["twin"]}
    if m["weights"] == "random":
        inputs["llamacpp"] = rules.llamacpp.output[0]
    return inputs


FILE_MODELS = [m for m in MODELS if "constants" not in model_config(m)]
BENCH_MODELS = [m for m in FILE_MODELS if model_config(m)["bench"]]
BUDGET_CHECK_MODELS = config["budget_check"]["models"] or FILE_MODELS
for name in BUDGET_CHECK_MODELS:
    if name not in FILE_MODELS:
        stop(
            f"config budget_check.models: {name!r} is not a model with a file (gguf or twin) in models."
        )
# Models whose weights llama.cpp can run: real files and random twins (not header-only twins).
WEIGHT_MODELS = [
    m
    for m in BENCH_MODELS
    if "gguf" in model_config(m) or model_config(m)["weights"] != "none"
]
# The ceilings, RAM-tier and quant stages measure one device: over several they are left out.
ONE_DEVICE = not SETTINGS.device.other_vram_bytes
CEILINGS = bool(config["ceilings"]["enabled"] and WEIGHT_MODELS and ONE_DEVICE)
ROUTING_MODELS = WEIGHT_MODELS if config["routing"]["enabled"] else []
RAM_TIER_MODELS = (
    [m for m in WEIGHT_MODELS if m in (config["ram_tier"]["models"] or WEIGHT_MODELS)]
    if config["ram_tier"]["enabled"] and ONE_DEVICE
    else []
)
for name in config["ram_tier"]["models"] or []:
    if name not in WEIGHT_MODELS:
        stop(
            f"config ram_tier.models: {name} is not a model with weights in models; use one of {', '.join(WEIGHT_MODELS)}."
        )
RANDOM_TWINS = [
    m for m in WEIGHT_MODELS if model_config(m).get("weights") == "random"
]  # their F16 can be quantized to any type
QUANTS_MODEL = config["quants"]["model"] or next(iter(RANDOM_TWINS), None)
if config["quants"]["model"] and QUANTS_MODEL not in RANDOM_TWINS:
    stop(
        f"config quants.model: {QUANTS_MODEL} is not a random-weight twin in models; the quant comparison "
        "quantizes a twin's F16 weights, so name one of: "
        + (", ".join(RANDOM_TWINS) or "(none configured)")
        + "."
    )
QUANTS = bool(config["quants"]["enabled"] and QUANTS_MODEL and ONE_DEVICE)


def get_tools_manifest():
    """The build our own tools link against: the plain pinned one (see rule llamacpp_tools)."""
    if config["llamacpp"]["bin_dir"] or config["llamacpp"]["cmake_options"]:
        return rules.llamacpp_tools.output[0]
    return rules.llamacpp.output[0]


def sweep_values(model, ctx):
    """The n_cpu_moe values benchmarked for one model and context (auto: from the budget checkpoint)."""
    import json

    import pandas as pd
    from moeplace.measure.bench import auto_sweep

    if (
        config["bench"]["n_cpu_moe"] != "auto"
    ):  # checked against the layer count at start-up
        return sorted(set(config["bench"]["n_cpu_moe"]))
    budget = pd.read_csv(checkpoints.budget.get(model=model).output[0])
    rows = budget[budget.ctx == ctx.tokens]
    if (
        rows.empty
    ):  # a dry run against a budget table from before this context was added
        return []
    with open(metadata_path(model)) as f:
        n_layer = json.load(f)["n_layer"]
    row = rows.iloc[0]
    return auto_sweep(
        int(row.n_cpu_moe) if row.status == "ok" else None,
        n_layer,
        step=config["bench"]["sweep_step"],
    )


def get_sweep_values(wildcards):
    return sweep_values(wildcards.model, CONTEXTS[wildcards.ctx])


def get_sweep_budget(wildcards):
    """The budget table an auto sweep's n values come from. Ancient: a new table (another context added)
    reruns a sweep only where its n values, a param, changed."""
    if config["bench"]["n_cpu_moe"] != "auto":
        return []
    return ancient(checkpoints.budget.get(model=wildcards.model).output[0])


def bench_files(models, contexts):
    """One record file per model and context: all its n values (none where the sweep is empty)."""
    return [
        rules.bench.output[0].format(model=model, ctx=label)
        for model in models
        for label in contexts
        if sweep_values(model, CONTEXTS[label])
    ]


def get_context_bench(wildcards):
    """Every benchmark record file of one context."""
    return bench_files(BENCH_MODELS, [wildcards.ctx])


def get_model_bench(wildcards):
    """Every benchmark record file of one model, all contexts."""
    return bench_files([wildcards.model], CONTEXTS)


def get_all_bench(wildcards):
    return bench_files(BENCH_MODELS, CONTEXTS)


def get_publish_inputs(wildcards):
    """What has been run so far: publish works from any subset of the pipeline's outputs."""
    from glob import glob

    found = {
        "tables": sorted(glob("results/tables/**/*.csv", recursive=True)),
        "figures": sorted(glob("results/figures/*.png")),
        "records": sorted(glob("results/bench/**/*.jsonl", recursive=True))
        + sorted(glob("results/variants/**/*.jsonl", recursive=True)),
        "metadata": sorted(glob("results/metadata/*.json")),
    }
    if Path(rules.llamacpp.output[0]).exists():
        found["llamacpp"] = rules.llamacpp.output[0]
    return found


def plain_config():
    """The resolved config as plain JSON values (for the published manifest)."""
    import json

    return json.loads(json.dumps(config, default=str))


def get_publish_missing(wildcards):
    """The pipeline's final outputs that have not been made (listed on the published page)."""
    return sorted(str(p) for p in get_final_outputs() if not Path(p).exists())


def get_publish_captions(wildcards):
    """Each figure's caption: the report() caption its rule names, with the figure's wildcards filled in
    (ncmoe_32k_pp.png: ncmoe_pp.rst for ctx 32k; ram_tier_<model>.png: ram_tier.rst for that model).
    """
    import re

    figures = [(f, maker) for maker in workflow.rules for f in maker.output
               if str(f).startswith("results/figures/") and f.flags.get("report")]  # fmt: skip
    captions = {}
    for path in sorted(Path("results/figures").glob("*.png")):
        for pattern, maker in figures:
            if not (m := pattern.match(str(path))):
                continue
            rst = Path(maker.snakefile).parent / str(pattern.flags["report"].caption)
            if rst.exists():
                fill = lambda w: m.groupdict().get(w[1], "")  # noqa: E731
                text = re.sub(
                    r"\{\{ *snakemake\.wildcards\.(\w+) *\}\}", fill, rst.read_text()
                )
                captions[f"figures/{path.name}"] = text.strip()
            break
    return captions
