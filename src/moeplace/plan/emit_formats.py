"""What `recommend --emit` can print, one record each: the format's name, what it is, the tool whose plan it
carries (llama-bench reserves logits for a whole batch, llama-server for one token per slot), and what it cannot
express. The request's checks, the command line's choices and help, and the text renderer read this table; adding a
format is a record here and its renderer in cli/recommend_text.py (tests/test_api.py ties the two)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmitFormat:
    name: str
    what: str  # the command line's help
    tool: str  # the llama.cpp program whose memory the plan counts: server or bench
    one_context: bool = False  # holds one context only (a Modelfile is one model)
    several_devices: bool = True  # can carry a split over several cards (-ts)


EMIT_FORMATS = (
    EmitFormat("server", "the plan in words with its llama-server line (default)", "server"),
    EmitFormat("bench", "the llama-bench line that checks the plan", "bench"),
    EmitFormat("llama-swap", "a llama-swap config with an entry per context", "server", several_devices=False),
    EmitFormat("ollama", "an Ollama Modelfile", "server", one_context=True, several_devices=False),
    EmitFormat("json", "the plan as JSON, every tool's line in it", "server"),
)
NAMES = tuple(f.name for f in EMIT_FORMATS)


def emit_format(name: str) -> EmitFormat:
    return next(f for f in EMIT_FORMATS if f.name == name)
