"""Flash attention in the commands moeplace writes: on exactly when llama.cpp needs it (a quantized V cache), alike
in the CLI's llama-server and llama-bench lines and in the pipeline's llama-bench command."""

from __future__ import annotations

from moeplace.core.config import BenchSettings
from moeplace.plan import commands
from moeplace.plan.request import Cache
from moeplace.runtime.build import Build
from moeplace.runtime.llamacpp import bench_command


def test_flash_attention_is_asked_for_alike_everywhere(tmp_path):
    """The CLI's llama-server line, its llama-bench line and the pipeline's llama-bench command all turn flash
    attention on exactly when llama.cpp needs it: a quantized V cache (a quantized K cache runs without)."""
    (tmp_path / "llama-bench").touch()  # bench_command only names the binary
    manifest = Build(tmp_path)
    for type_k, type_v, fa in (
        ("f16", "f16", False),
        ("q8_0", "f16", False),
        ("f16", "q8_0", True),
        ("q8_0", "q4_0", True),
    ):
        server = commands.llama_server("m.gguf", 4096, 3, Cache(type_k, type_v))
        bench_line = commands.llama_bench("m.gguf", 4096, 3, Cache(type_k, type_v))
        settings = BenchSettings(16, 4, 1, 2, 60, type_k=type_k, type_v=type_v)
        pipeline = " ".join(bench_command(manifest, "m.gguf", 4096, 3, settings, None))
        assert [("-fa on" in cmd) for cmd in (server, bench_line, pipeline)] == [fa] * 3, (type_k, type_v)
