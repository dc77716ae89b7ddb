import sys
from pathlib import Path

from moeplace.config import validate_config
from moeplace.errors import MoeplaceError
from moeplace.gguf_file import shard_paths

try:
    validate_config(config, workflow.source_path("../schemas/config.schema.yaml"))
except MoeplaceError as e:
    sys.exit(f"moeplace: {e}")


wildcard_constraints:
    model="[A-Za-z0-9][A-Za-z0-9._-]*",
    ctx=r"\d+",


MODELS = list(config["models"])


def model_config(model):
    return config["models"][model]


def get_model_gguf(wildcards):
    """The GGUF file(s) a model is read from: the user's file (all shards) or its twin."""
    m = model_config(wildcards.model)
    if "gguf" in m:
        try:
            return [str(p) for p in shard_paths(Path(m["gguf"]))]
        except MoeplaceError as e:
            sys.exit(f"moeplace: config models.{wildcards.model}.gguf: {e}")
    if "twin" in m:
        return [f"resources/models/{wildcards.model}.gguf"]
    return []


def get_bandwidths():
    measured = config["measured"]
    return {
        "vram_gbps": config["device"]["bw_vram_gbps"],
        "ddr_gbps": config["host"]["bw_ddr_gbps"],
        "measured_vram_gbps": measured.get("bw_vram_gbps"),
        "measured_ddr_gbps": measured.get("bw_ddr_gbps"),
        "eta": measured.get("eta"),
    }


def get_final_outputs():
    return expand(
        [
            "results/metadata/{model}.json",
            "results/tables/predicted/{model}.csv",
            "results/tables/budget/{model}.csv",
        ],
        model=MODELS,
    )


def get_twin_inputs(wildcards):
    m = model_config(wildcards.model)
    inputs = {"spec": m["twin"]}
    if m["weights"] == "random":
        inputs["llamacpp"] = "resources/llamacpp/llamacpp.json"
    return inputs
