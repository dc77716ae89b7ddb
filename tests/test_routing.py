"""Expert-routing traces: the table's arithmetic on synthetic ids, and a real trace of the tiny twin."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from moeplace.core.errors import MoeplaceError
from moeplace.measure.routing import (
    RoutingTrace,
    TraceRequest,
    parse_trace,
    routing_table,
    save_trace,
    trace_routing,
)
from moeplace.report.figures.routing import routing_figure
from moeplace.runtime.build import Build


def synthetic(ids: np.ndarray, n_expert: int, n_prompt: int = 0) -> RoutingTrace:
    ids = np.asarray(ids, dtype=np.int32)
    return RoutingTrace(ids, list(range(ids.shape[1])), n_expert, n_prompt)


def uniform_ids(n_tokens: int, n_layers: int, n_expert: int, k: int, seed: int = 0) -> np.ndarray:
    """Each (token, layer) a uniformly random k-subset of the experts."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((n_tokens, n_layers, n_expert)), axis=2)[:, :, :k]


def test_always_the_same_experts():
    ids = np.tile(np.array([3, 7, 11, 30]), (50, 2, 1))
    table = routing_table(synthetic(ids, 32))
    assert list(table.layer) == [0, 1]
    assert (table.overlap_d1 == 1).all() and (table.overlap_d8 == 1).all() and (table.overlap_shuffled == 1).all()
    assert (table.distinct_experts == 4).all()
    assert (table.experts_80pct == 4).all()  # 4 experts at 25% each: three cover only 75%
    assert (table.experts_80pct_uniform == 26).all()  # ceil(0.8 * 32)
    assert (table.overlap_uniform == 4 / 32).all()
    assert table.tokens.iloc[0] == 50 and table.n_expert.iloc[0] == 32 and table.n_expert_used.iloc[0] == 4


def test_hand_counted():
    # k=2 of E=4: {0,1} {1,2} {0,1}; counts 0:2 1:3 2:1 of 6.
    table = routing_table(synthetic([[[0, 1]], [[1, 2]], [[1, 0]]], 4))
    row = table.iloc[0]
    assert row.overlap_d1 == pytest.approx(0.5)
    assert math.isnan(row.overlap_d8)  # no token 8 steps later
    assert row.distinct_experts == 3
    assert row.experts_80pct == 2  # 3+2 = 5 >= 4.8
    assert row.experts_80pct_uniform == 4  # ceil(3.2)
    assert row.distinct_uniform == pytest.approx(4 * (1 - 0.5**3))
    # Pairs: (0,1) share 1, (0,2) share 2, (1,2) share 1 -> mean 4/3 of k=2.
    assert row.overlap_shuffled == pytest.approx(2 / 3)


def test_exact_80pct_boundary():
    # 10 experts, k=1, 10 tokens each on a different expert: exactly 8 cover 80% (no float ceil(8.000001) = 9).
    table = routing_table(synthetic(np.arange(10).reshape(10, 1, 1), 10))
    assert table.experts_80pct.iloc[0] == 8 and table.experts_80pct_uniform.iloc[0] == 8


def test_uniform_routing_matches_the_nulls():
    n_expert, k, n_tok = 32, 4, 4000
    table = routing_table(synthetic(uniform_ids(n_tok, 3, n_expert, k), n_expert))
    assert np.allclose(table.overlap_d1, k / n_expert, atol=0.01)
    assert np.allclose(table.overlap_d8, k / n_expert, atol=0.01)
    assert np.allclose(table.overlap_shuffled, k / n_expert, atol=0.005)
    assert (table.distinct_experts == 32).all() and np.allclose(table.distinct_uniform, 32)
    assert (abs(table.experts_80pct - table.experts_80pct_uniform) <= 1).all()
    few = routing_table(synthetic(uniform_ids(6, 200, n_expert, k, seed=1), n_expert))
    # 6 tokens x 4 of 32: expected distinct 32 * (1 - (28/32)^6) = 17.0, averaged over 200 layers.
    assert few.distinct_experts.mean() == pytest.approx(few.distinct_uniform.iloc[0], rel=0.05)


def test_parts():
    ids = np.concatenate([np.tile([0, 1], (5, 1, 1)), np.tile([2, 3], (3, 1, 1))])
    trace = synthetic(ids, 8, n_prompt=5)
    assert routing_table(trace, "prompt").tokens.iloc[0] == 5
    gen = routing_table(trace, "generated")
    assert gen.tokens.iloc[0] == 3 and gen.distinct_experts.iloc[0] == 2
    assert routing_table(trace).distinct_experts.iloc[0] == 4
    with pytest.raises(MoeplaceError, match="unknown trace part"):
        routing_table(trace, "decode")


def test_parse_and_roundtrip(tmp_path: Path):
    text = "moeplace-routing 1\n4 8 2 1 2\n0 1 0 5\n0 3 2 7\n1 1 4 1\n1 3 6 3\n"
    trace = parse_trace(text)
    assert trace.layers == [1, 3] and trace.n_expert == 8 and trace.n_token_prompt == 1
    assert trace.ids.dtype == np.int32 and trace.ids.tolist() == [[[0, 5], [2, 7]], [[4, 1], [6, 3]]]
    save_trace(trace, tmp_path / "t.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]
    with np.load(tmp_path / "t.npz", allow_pickle=False) as back:  # the file as any reader of .npz sees it
        assert back["layers"].tolist() == trace.layers and np.array_equal(back["ids"], trace.ids)
        assert (int(back["n_expert"]), int(back["n_token_prompt"])) == (8, 1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("hello\n", "does not start with"),
        ("moeplace-routing 1\n4 8 2 1 2\n0 1 0 5\n", "rows, expected 2 tokens"),
        ("moeplace-routing 1\n4 8 2 1 1\n0 1 0 9\n", "outside"),
        ("moeplace-routing 1\n4 8 2 1 1\n0 1 0\n", "do not make rows"),
        ("moeplace-routing 1\n4 8 2 1 2\n1 1 0 5\n0 1 2 7\n", "token order"),
        ("moeplace-routing 1\n4 8 2 x 1\n", "malformed"),
    ],
)
def test_parse_rejects(text: str, message: str):
    with pytest.raises(MoeplaceError, match=message):
        parse_trace(text)


def test_plot(tmp_path: Path):
    trace = synthetic(uniform_ids(40, 6, 16, 2), 16, n_prompt=30)
    out = tmp_path / "routing.png"
    routing_figure(trace, routing_table(trace), out, "synthetic")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.llamacpp
def test_trace_of_the_tiny_twin(tmp_path: Path):
    from llamacpp_helpers import manifest, tiny_twin

    model = tiny_twin(tmp_path)
    prompt = "Mixture-of-experts models send every token to a few experts; which ones, and how often?\n" * 3
    n_gen = 8
    trace = trace_routing(manifest(), model, TraceRequest(prompt, n_gen, verify=True), 2, tmp_path / "routing.log", 120)
    # llama.cpp's "test" vocabulary (the twin's) makes one token per 5 bytes and adds no BOS.
    assert trace.n_token_prompt == math.ceil(len(prompt.encode()) / 5)
    assert trace.ids.shape == (trace.n_token_prompt + n_gen, 8, 4)  # every prompt row, the last layer's too
    assert trace.layers == list(range(8)) and trace.n_expert == 32
    assert trace.ids.min() >= 0 and trace.ids.max() < 32
    assert all(len(set(row)) == 4 for row in trace.ids.reshape(-1, 4).tolist())
    assert "--verify:" in (tmp_path / "routing.log").read_text()  # each selection was the top 4 of its scores
    table = routing_table(trace)
    assert len(table) == 8 and table.overlap_d1.between(0, 1).all()


@pytest.mark.llamacpp
def test_tool_failures_are_one_line(tmp_path: Path):
    from llamacpp_helpers import manifest

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(MoeplaceError, match=r"failed: cannot load the model") as e:
        trace_routing(manifest(), bad, TraceRequest("hello", 1), 1, tmp_path / "routing.log", 60)
    assert "\n" not in str(e.value)
    with pytest.raises(MoeplaceError, match="pinned build"):
        trace_routing(Build(tmp_path / "bin"), bad, TraceRequest("hello", 1), 1, tmp_path / "routing.log", 60)
