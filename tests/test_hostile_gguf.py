"""A lying or broken GGUF gives one clear MoeplaceError: never a traceback, a hang or a huge allocation."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeplace.errors import MoeplaceError
from moeplace.metadata import inspect_model


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    from moeplace.twin import load_spec, write_twin

    path = write_twin(load_spec(ROOT / "tests/specs/tiny-gpt-oss.yaml"), tmp_path_factory.mktemp("v") / "v.gguf")
    return path.read_bytes()


def expect_clean_error(path: Path, match: str | None = None) -> None:
    with pytest.raises(MoeplaceError, match=match) as err:
        inspect_model(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt) :]


@pytest.mark.parametrize(
    "case,match",
    [
        (lambda d: b"GGML" + d[4:], "wrong magic"),
        (lambda d: patch(d, 4, "<I", 7), "version 7"),
        (lambda d: patch(d, 8, "<Q", 2**63), "more than the file can hold"),
        (lambda d: patch(d, 16, "<Q", 2**62), "more than the file can hold"),
        (lambda d: patch(d, 24, "<Q", 2**60), "runs past the end"),  # first key's length
        (lambda d: d[:20], "too small|truncated"),
    ],
)
def test_named_corruptions(valid, tmp_path, case, match):
    path = tmp_path / "bad.gguf"
    path.write_bytes(case(valid))
    expect_clean_error(path, match)


def test_truncated_at_every_section(valid, tmp_path):
    path = tmp_path / "cut.gguf"
    end = len(valid)
    for cut in sorted({24, 100, 1000, 5000, end // 4, end // 2, end - 1}):
        path.write_bytes(valid[:cut])
        expect_clean_error(path)


def test_unknown_type_duplicate_name_and_misaligned_offset(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    def write(name: str, tensors) -> Path:
        w = GGUFWriter(tmp_path / name, "qwen3moe")
        w.add_uint32("qwen3moe.block_count", 1)
        w.add_uint32("qwen3moe.embedding_length", 32)
        for tname, raw in tensors:
            w.add_tensor(tname, raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return tmp_path / name

    good = write("good.gguf", [("blk.0.attn_k.weight", np.zeros((4, 32), np.float32))])
    data = good.read_bytes()
    i = data.index(b"blk.0.attn_k.weight") + len("blk.0.attn_k.weight")
    # after the name: n_dims (u32), 2 dims (u64 each), type (u32), offset (u64)
    (tmp_path / "type.gguf").write_bytes(patch(data, i + 4 + 16, "<I", 99))
    expect_clean_error(tmp_path / "type.gguf", "unknown ggml type 99")
    (tmp_path / "offset.gguf").write_bytes(patch(data, i + 4 + 16 + 4, "<Q", 3))
    expect_clean_error(tmp_path / "offset.gguf", "not aligned")
    dup = write(
        "dup.gguf",
        [
            ("blk.0.attn_k.weight", np.zeros((4, 32), np.float32)),
            ("blk.0.attn_v.weight", np.zeros((4, 32), np.float32)),
        ],
    )
    data = dup.read_bytes().replace(b"blk.0.attn_v.weight", b"blk.0.attn_k.weight")
    dup.write_bytes(data)
    expect_clean_error(dup, "appears twice")


def test_missing_architecture_keys(tmp_path):
    from conftest import write_gguf
    from gguf import GGMLQuantizationType as Q

    path = write_gguf(tmp_path / "nokeys.gguf", "qwen3moe", {}, [("blk.0.attn_k.weight", (32, 4), Q.F32)])
    expect_clean_error(path, "qwen3moe.block_count")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_headers_never_escape_as_tracebacks(valid, tmp_path, data):
    blob = bytearray(valid[:6000])  # the header region and a little data
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["byte", "u64", "cut"]))
        at = data.draw(st.integers(0, len(blob) - 9))
        if kind == "byte":
            blob[at] = data.draw(st.integers(0, 255))
        elif kind == "u64":
            blob[at : at + 8] = struct.pack(
                "<Q", data.draw(st.sampled_from([0, 1, 2**31, 2**32 + 7, 2**62, 2**64 - 1]))
            )
        else:
            del blob[at:]
            if len(blob) < 16:
                blob += bytes(16)
    path = tmp_path / "mutant.gguf"
    path.write_bytes(bytes(blob) + bytes(len(valid) - 6000))
    try:
        inspect_model(path)
    except MoeplaceError as e:
        assert "\n" not in str(e)


def test_cli_on_a_hostile_file_is_one_line(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40))
    out = subprocess.run(
        [sys.executable, "-m", "moeplace.cli", "inspect", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
