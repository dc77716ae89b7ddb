"""Each full-size spec's header-only twin against a published GGUF of the same quant: its file size within the
published figure's rounding and the few MB of tokenizer a twin does not carry (tests/data/published_gguf_sizes.yaml,
each number with its source). A header twin is a sparse file: the whole check takes seconds."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import yaml
from conftest import ROOT

from moeplace.model.twin import load_spec, write_twin

PUBLISHED = yaml.safe_load((ROOT / "tests/data/published_gguf_sizes.yaml").read_text())
FULL = sorted(p.stem for p in (ROOT / "config/models").glob("*.yaml") if not p.stem.startswith("tiny-"))
KNOWN = sorted(name for name, entry in PUBLISHED.items() if "none" not in entry)
# What a real file carries beyond its twin: the tokenizer's strings, BPE merges and chat template (5.6 MB for
# Qwen3.6's 248k vocabulary, 8.7 MB for gpt-oss's o200k, both measured against exact published bytes) and
# llama.cpp-version differences in small tensors; 0.3% of the file, a fraction of the ~1% a wrong tensor type costs.
ALLOWANCE = 0.003
SHOWN = re.compile(r"^(\d+(?:\.\d+)?) GB$")


def published_bytes(entry: dict) -> tuple[float, float]:
    """The published size and the half unit of its rounding, in bytes: exact bytes, or the sum of Hugging Face's
    shown figures (decimal GB to three significant figures: 26.4 GB is 26.35-26.45 GB) and of their half units."""
    if "bytes" in entry:
        return float(entry["bytes"]), 0.0
    total = rounding = 0.0
    for shown in entry["shown"]:
        gb = float(SHOWN.match(shown)[1])
        total += gb * 1e9
        rounding += 0.5 * 10 ** (math.floor(math.log10(gb)) - 2) * 1e9
    return total, rounding


def test_every_full_size_spec_has_a_published_size_or_says_why_not():
    assert sorted(PUBLISHED) == FULL
    for name, entry in PUBLISHED.items():
        assert entry.get("quant"), name
        if "none" not in entry:
            assert entry["repo"] and entry["file"] and entry["source"] and ("bytes" in entry or "shown" in entry), name
            assert "tolerance" not in entry or (entry["why"] and entry["tolerance"] <= 0.01), name


def test_the_rounding_of_a_shown_size_is_half_its_last_digit():
    assert published_bytes({"shown": ["26.4 GB"]}) == pytest.approx((26.4e9, 0.05e9))
    assert published_bytes({"shown": ["4.21 GB", "46 GB"]}) == pytest.approx((50.21e9, 0.055e9))
    assert published_bytes({"bytes": 21166757888}) == (21166757888.0, 0.0)


@pytest.mark.parametrize("name", KNOWN)
def test_the_header_twin_is_the_published_files_size(name, tmp_path):
    entry = PUBLISHED[name]
    spec = load_spec(ROOT / f"config/models/{name}.yaml")
    size = write_twin(spec, tmp_path / f"{name}.gguf", "none").stat().st_size
    published, rounding = published_bytes(entry)
    gap = size - published
    print(f"{name}: twin {size:,} bytes, published {published:,.0f} ({entry['repo']}), {100 * gap / published:+.2f}%")
    # An entry whose file is not llama-quantize's plain recipe says so (why) and how far off it may be (tolerance).
    assert abs(gap) <= rounding + entry.get("tolerance", ALLOWANCE) * published, (name, size, published)


def test_a_twin_with_a_block_the_published_file_lacks_is_caught(tmp_path):
    """Qwen3.6-35B-A3B with its NextN/MTP block (41 blocks, as the spec was): 2.6% over the published Q4_K_M."""
    spec = load_spec(ROOT / "config/models/qwen3.6-35b-a3b.yaml")
    mtp = dataclasses.replace(spec, n_layer=41, params=dataclasses.replace(spec.params, nextn_predict_layers=1))
    size = write_twin(mtp, tmp_path / "mtp.gguf", "none").stat().st_size
    published, rounding = published_bytes(PUBLISHED["qwen3.6-35b-a3b"])
    assert size - published > rounding + ALLOWANCE * published
