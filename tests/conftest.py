"""Shared fixtures: small GGUF files written with gguf's own writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from moeplace.model.gguf_file import tensor_nbytes
from moeplace.model.twin import load_spec, write_twin

ROOT = Path(__file__).resolve().parents[1]
# The seed's Qwen3-Coder-30B-A3B at Q4_K_M on its 16 GB card (seed 000 §5.3, §5.7).
SEED_CONSTANTS = {
    "layers": 48,
    "expert": "17.41GB",
    "non_expert": "0.89GB",
    "kv_bytes_per_token": 98304,
    "n_expert": 128,
    "n_expert_used": 8,
}


def write_gguf(
    path: Path, arch: str, keys: dict, tensors: list[tuple[str, tuple[int, ...], Q]], extra: dict | None = None
) -> Path:
    """A header-only GGUF: keys are '<arch>.'-relative, tensors (name, ne, type), data a sparse hole."""
    w = GGUFWriter(path, arch)
    for key, value in keys.items():
        full = f"{arch}.{key}"
        if isinstance(value, list):
            w.add_array(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, value)
    for key, value in (extra or {}).items():
        w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, value)
    total = 0
    for name, ne, qtype in tensors:
        nbytes = tensor_nbytes(qtype.name, ne)
        w.add_tensor_info(name, list(reversed(ne)), np.float32, nbytes, raw_dtype=qtype)
        total += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    w.write_padding(f, f.tell())
    f.truncate(f.tell() + total)
    w.close()
    return path


@pytest.fixture(scope="session")
def qwen3_twin(tmp_path_factory) -> Path:
    """The seed's Qwen3-Coder-30B-A3B at Q4_K_M as a header-only twin (sparse: the weights are not written)."""
    spec = load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml")
    return write_twin(spec, tmp_path_factory.mktemp("twin") / "qwen3-coder.gguf")


@pytest.fixture
def projector(tmp_path: Path) -> Path:
    """A header-only multimodal projector, as llama.cpp's --mmproj takes (general.architecture 'clip')."""
    keys = {"vision.embedding_length": 256, "vision.block_count": 1}
    tensors = [("v.patch_embd.weight", (14, 14, 3, 256), Q.F16), ("mm.0.weight", (256, 256), Q.F16)]
    return write_gguf(tmp_path / "mmproj.gguf", "clip", keys, tensors)


@pytest.fixture
def small_moe(tmp_path: Path) -> Path:
    """2 layers, 4 experts (2 used), hand-countable bytes."""
    E, F, X = 256, 256, 4
    tensors = [
        ("token_embd.weight", (E, 1000), Q.Q8_0),
        ("output_norm.weight", (E,), Q.F32),
        ("output.weight", (E, 1000), Q.Q6_K),
    ]
    for il in range(2):
        b = f"blk.{il}."
        tensors += [
            (b + "attn_norm.weight", (E,), Q.F32),
            (b + "attn_q.weight", (E, 256), Q.Q4_K),
            (b + "attn_k.weight", (E, 64), Q.Q4_K),
            (b + "attn_v.weight", (E, 64), Q.Q6_K),
            (b + "attn_output.weight", (256, E), Q.Q4_K),
            (b + "ffn_norm.weight", (E,), Q.F32),
            (b + "ffn_gate_inp.weight", (E, X), Q.F32),
            (b + "ffn_gate_exps.weight", (E, F, X), Q.Q4_K),
            (b + "ffn_up_exps.weight", (E, F, X), Q.Q4_K),
            (b + "ffn_down_exps.weight", (F, E, X), Q.Q6_K),
        ]
    keys = {
        "block_count": 2,
        "embedding_length": E,
        "attention.head_count": 4,
        "attention.head_count_kv": 1,
        "expert_count": X,
        "expert_used_count": 2,
        "context_length": 4096,
    }
    return write_gguf(tmp_path / "small.gguf", "qwen3moe", keys, tensors)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook
    """docs/faults.md's fault matrix, row by row, as this run found it (docs/fault_matrix.py writes the table)."""
    outcomes = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if "fault" in getattr(report, "keywords", {}) and (report.when == "call" or outcome != "passed"):
                outcomes[report.nodeid] = outcome
    if outcomes:
        terminalreporter.section("fault matrix")
        for nodeid, outcome in sorted(outcomes.items()):
            terminalreporter.line(f"{outcome:>7}  {nodeid}")
