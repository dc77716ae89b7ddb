"""Real-card memory (docs/real-cards.md): moeplace's device buffers against what real GPUs printed.

For every corpus log a twin stands in for, our weights match the log's buffers to within the printed rounding and
the buffers' alignment, and our KV cache matches exactly, once the run's placement and each build's own cache
sizing are applied; the published --n-cpu-moe out-of-memory boundaries agree with our need; the typed readings are
the corpus text's; and the document is what the facts give.
"""

from __future__ import annotations

import sys

import corpus
import pytest
import yaml
from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import real_cards  # noqa: E402

MAINLINE_QWEN = "cuda-multi-mainline-qwen3-30b-ot-cpu-4090-5090.txt"


@pytest.fixture(scope="module")
def built():
    text, rows, boundaries, facts = real_cards.build()
    return text, rows, boundaries, facts


@pytest.fixture(scope="module")
def facts():
    return yaml.safe_load(real_cards.FACTS.read_text())


def off(rows, kind):
    """The rows whose difference, less the explained one, falls outside its bounds: (log, ours, expected, bounds)."""
    return {
        r.file: (r.log[kind], round(r.ours[kind], 3), r.expect.get(kind, 0.0), r.bounds[kind])
        for r in rows
        if not r.within(kind)
    }


def test_every_log_of_the_corpus_is_twinned_or_says_why(facts):
    logs = {s.path.name for s in corpus.samples("log")}
    assert set(facts["logs"]) == logs, sorted(set(facts["logs"]) ^ logs)
    for name, fact in facts["logs"].items():
        if "why" in fact:
            assert fact["why"].strip() and "\n" not in fact["why"], name
        else:
            assert fact["twin"] in real_cards.TWIN_LEVELS and fact["card"] and fact["ctx"] > 0, name
            assert fact["twin"] == "shapes" or fact["quant"], f"{name}: a weights twin names its quant"


def test_weights_match_the_logs_buffers(built):
    """Exact and inferred twins: within the printed rounding (0.005 MiB a device, or the memory breakdown's whole
    MiB) below, and that plus each tensor's alignment padding (at most 256 bytes) above."""
    rows = [r for r in built[1] if r.compared("weights")]
    assert len(rows) >= 8
    assert {r.fact["twin"] for r in rows} == {"exact", "inferred"}
    assert not off(rows, "weights")


def test_kv_matches_the_logs_buffers_exactly(built):
    """To the printed rounding, once a build's own padding or unified cache is taken off (ik_llama.cpp pads each
    cache tensor a little more: 0.05 MiB)."""
    rows = [r for r in built[1] if r.compared("kv")]
    assert len(rows) >= 16
    assert not off(rows, "kv")


def test_compute_is_close_where_every_matrix_is_on_the_device(built):
    """Compute is printed for every row and asserted only loosely: ours is an estimate (the graph's largest live
    tensors; llama.cpp's own reserve, which needs a build, is the exact figure), and where a matrix lives on the
    host llama.cpp copies it into the device's compute buffer to multiply it there, which the estimate does not
    count. Too low risks an out-of-memory, too high only a layer of experts: so, where every matrix is on the
    device, at most 10% below the log and 25% above; anywhere, at most 25% above."""
    rows = [r for r in built[1] if r.compared("compute")]
    ratios = {r.file: r.ours["compute"] / r.log["compute"] for r in rows}
    device_only = [r.file for r in rows if r.device_only]
    assert len(device_only) >= 4
    assert {f: ratios[f] for f in device_only if not 0.9 <= ratios[f] <= 1.25} == {}
    assert {f: q for f, q in ratios.items() if q > 1.25} == {}


def test_a_wrong_quant_context_or_placement_is_caught(facts, tmp_path):
    """The checks are not vacuous: the same log with another quant, context or placement falls outside them."""
    fact = facts["logs"][MAINLINE_QWEN]
    sample = corpus.load(corpus.CORPUS / MAINLINE_QWEN)
    twins = real_cards.Twins(tmp_path, facts["specs"])

    def row(**change):
        return real_cards.row_for(MAINLINE_QWEN, {**fact, **change}, sample, twins)

    right = row()
    assert right.within("weights") and right.within("kv")
    assert not row(quant="Q4_K_S").within("weights")
    assert not row(placement={}).within("weights")
    assert not row(ctx=8192).within("kv")
    assert not row(type_k="q8_0", type_v="q8_0").within("kv")


def test_the_readings_are_the_corpus_texts(facts):
    samples = {s.path.name: s for s in corpus.samples()}
    for reading in facts["readings"]:
        real_cards.check_reading(reading, samples[reading["file"]])
    typo = next(r for r in facts["readings"] if r["kind"] == "load")
    with pytest.raises(AssertionError):
        real_cards.check_reading({**typo, "free": typo["free"] + 1}, samples[typo["file"]])
    backends = {samples[r["file"]].header["backend"] for r in facts["readings"]}
    assert backends == set(real_cards.BACKENDS), "a backend lost its readings"


def test_published_boundaries_agree_with_our_need(built):
    """Every n that ran fits ours at margin 0 on the memory the card had (ours never needs more than the card
    held), the n that failed needs more than the n that ran, and the SYCL card's five boundaries allow one margin
    over its free memory (the largest margin that rules out a failed n is below the smallest that keeps a ran n)."""
    boundaries = built[2]
    assert len(boundaries) >= 6
    for b, out in boundaries:
        assert out["need_failed"] > out["need_ran"], b["setup"]
        for key in ("vram_nominal", "free_at_load"):
            if key in out:
                assert out[key]["keep_ran"] >= 0, (b["setup"], key, out[key])
    sycl = [out["free_at_load"] for b, out in boundaries if b["backend"] == "sycl"]
    assert max(o["exclude_failed"] for o in sycl) < min(o["keep_ran"] for o in sycl)


def test_the_document_is_current(built):
    assert real_cards.OUT.read_text() == built[0], "docs/real-cards.md is out of date: run python docs/real_cards.py"
