"""The card's datasheet bandwidth and FP32 throughput, found from the name the tools print (plan/cards.py).

Names as they appear in the corpus (tests/data/llamacpp/); values typed from the vendors' specifications.
"""

from __future__ import annotations

import pytest

from moeplace.plan.cards import datasheet


@pytest.mark.parametrize(
    ("printed", "gbps", "tflops"),
    [
        ("NVIDIA GeForce RTX 3090", 936, 35.6),  # fit-projection-3x3090-3060-asymmetric.txt
        ("NVIDIA GeForce RTX 3090 Ti", 1008, 40.0),
        ("NVIDIA GeForce RTX 4090 D", 1008, 73.5),  # cuda-single-ik-deepseek-r1-ot-exps-4090d.txt
        ("NVIDIA GeForce RTX 4060 Laptop GPU", 256, 11.6),  # list-devices-vulkan-rtx4060-laptop.txt: not a desktop 4060
        ("AMD Radeon RX 7900 XTX", 960, 61.4),  # rocm-old-7900xtx-q8-kv-draft-server.txt
        ("AMD Radeon RX 6800", 512, 16.2),
        ("NVIDIA GeForce RTX 4070 Ti", 504, 40.1),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", 672, 44.1),  # not read as a 4070 Ti
        ("NVIDIA H200", 4800, 67),
        ("Tesla T4", 320, 8.1),
        ("NVIDIA GeForce RTX 2080 Ti", 616, 13.4),  # cuda-oom-compute-ik-qwen3-235b-pipeline-2x2080ti.txt
    ],
)
def test_a_known_card_gets_its_datasheet_bandwidth_and_compute(printed, gbps, tflops):
    found = datasheet(printed)
    assert (found.gbps, found.tflops) == (gbps, tflops)
    assert "datasheet (" in found.source and ".com" in found.source


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
    assert datasheet(printed) is None
