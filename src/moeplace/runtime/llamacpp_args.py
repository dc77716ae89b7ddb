"""llama.cpp's command-line conventions moeplace writes and plans by: its batch defaults, the flags of a KV
cache type, flash attention and ubatch, and the combination of them it refuses to run."""

from __future__ import annotations

from ..core.config_schema import default

# llama.cpp's own defaults, which the pipeline's config and the command line default to (the numbers are in
# core/config.schema.yaml, the one place every setting's default is written); a line leaves -ub out at it.
DEFAULT_UBATCH = default("ubatch")
DEFAULT_CACHE_TYPE = default("cache_type_k")
DEFAULT_FLASH_ATTN = default("flash_attn")
DEFAULT_BATCH = 2048  # llama.cpp's -b
UNSUPPORTED = "unsupported"  # the status of a run llama.cpp refuses (refusal): recorded, never run


def needs_flash_attn(type_v: str) -> bool:
    """llama.cpp refuses a quantized V cache without flash attention (a quantized K cache runs without)."""
    return type_v not in ("f16", "bf16", "f32")


def refusal(flash_attn: str, type_v: str) -> str | None:
    """Why llama.cpp refuses to run this KV cache with this flash attention setting (None where it runs them): the
    one test every stage asks before it starts llama.cpp, recording UNSUPPORTED instead. "auto" turns flash
    attention on where a quantized V cache needs it (cache_args)."""
    if flash_attn == "off" and needs_flash_attn(type_v):
        return f"llama.cpp refuses a quantized V cache ({type_v}) without flash attention (-fa off)"
    return None


def batch_for(ubatch: int) -> int:
    """The -b that goes with a -ub: llama.cpp's default batch, raised to the ubatch (it needs -b >= -ub)."""
    return max(ubatch, DEFAULT_BATCH)


def cache_args(type_k: str, type_v: str, flash_attn: str = "auto", ubatch: int = DEFAULT_UBATCH) -> list[str]:
    """llama.cpp's flags for this KV cache, flash attention and ubatch (none for the defaults)."""
    args = [] if (type_k, type_v) == ("f16", "f16") else ["--cache-type-k", type_k, "--cache-type-v", type_v]
    if flash_attn == "auto" and needs_flash_attn(type_v):
        flash_attn = "on"
    if flash_attn != "auto":
        args += ["-fa", flash_attn]
    if ubatch != DEFAULT_UBATCH:
        args += ["-ub", str(ubatch), "-b", str(batch_for(ubatch))]
    return args
