"""The card's datasheet bandwidth, found from the name the tools print (plan/cards.py).

Names as they appear in the corpus (tests/data/llamacpp/); bandwidths typed from the vendors' specifications.
"""

from __future__ import annotations

import pytest

from moeplace.plan.cards import datasheet_bandwidth


@pytest.mark.parametrize(
    ("printed", "gbps"),
    [
        ("NVIDIA GeForce RTX 3090", 936),  # fit-projection-3x3090-3060-asymmetric.txt
        ("NVIDIA GeForce RTX 3090 Ti", 1008),
        ("NVIDIA GeForce RTX 4090 D", 1008),  # cuda-single-ik-deepseek-r1-ot-exps-4090d.txt
        ("NVIDIA GeForce RTX 4060 Laptop GPU", 256),  # list-devices-vulkan-rtx4060-laptop.txt: not a desktop 4060
        ("AMD Radeon RX 7900 XTX", 960),  # rocm-old-7900xtx-q8-kv-draft-server.txt
        ("AMD Radeon RX 6800", 512),
        ("NVIDIA GeForce RTX 4070 Ti", 504),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", 672),  # not read as a 4070 Ti
        ("NVIDIA H200", 4800),
        ("Tesla T4", 320),
        ("NVIDIA GeForce RTX 2080 Ti", 616),  # cuda-oom-compute-ik-qwen3-235b-pipeline-2x2080ti.txt
    ],
)
def test_a_known_card_gets_its_datasheet_bandwidth(printed, gbps):
    found, source = datasheet_bandwidth(printed)
    assert found == gbps and "datasheet (" in source and ".com" in source


@pytest.mark.parametrize(
    "printed",
    [
        "NVIDIA GeForce RTX 3060",  # sold with a 192-bit (360 GB/s) and a 128-bit (240 GB/s) bus under one name
        "NVIDIA RTX PRO 4000 Blackwell SFF Edition",  # list-devices-cuda-2gpu-3080ti-rtxpro4000-ollama.txt
        "AMD Radeon Graphics",  # an unnamed iGPU
        "NVIDIA GeForce GTX 1650",  # not in the table
    ],
)
def test_an_ambiguous_or_unknown_card_gets_none(printed):
    assert datasheet_bandwidth(printed) is None
