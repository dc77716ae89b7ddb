"""The card's datasheet bandwidth and FP32 throughput, found from the name the tools print (plan/cards.py).

Names as they appear in the corpus (tests/data/llamacpp/); values typed from the vendors' specifications.
"""

from __future__ import annotations

import pytest

from moeplace.core.errors import MoeplaceError
from moeplace.plan.cards import CARDS, card_named, datasheet


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


@pytest.mark.parametrize(
    ("typed", "name", "gib", "gbps", "backend", "unified"),
    [
        ("7900xtx", "RX 7900 XTX", 24, 960, "rocm", False),  # typed without a space
        ("rx6700xt", "RX 6700 XT", 12, 384, "rocm", False),
        ("RTX 3080 10GB", "RTX 3080 10GB", 10, 760, "cuda", False),  # 320-bit, 19 Gbps
        ("3080 12gb", "RTX 3080 12GB", 12, 912, "cuda", False),  # 384-bit, 19 Gbps
        ("Tesla P40", "P40", 24, 346, "cuda", False),
        ("Arc A770 16GB", "Arc A770 16GB", 16, 560, "sycl", False),  # 256-bit, 17.5 Gbps
        ("b580", "Arc B580", 12, 456, "sycl", False),  # 192-bit, 19 Gbps
        ("4090d", "RTX 4090 D", 24, 1008, "cuda", False),
        ("M4 Pro 48GB", "M4 Pro 48GB", 48, 273, "metal", True),  # Apple: 273 GB/s
        ("m4pro 48 gb", "M4 Pro 48GB", 48, 273, "metal", True),
        ("M4 Max 36GB", "M4 Max 36GB", 36, 410, "metal", True),  # the 36 GB M4 Max has the 384-bit bus
        ("M4 Max 128GB", "M4 Max 128GB", 128, 546, "metal", True),
        ("M2 Ultra 192GB", "M2 Ultra 192GB", 192, 800, "metal", True),
        ("Radeon 8060S 128GB", "Radeon 8060S 128GB", 128, 256, "rocm", True),  # Strix Halo: the system's RAM
    ],
)
def test_a_card_is_found_as_a_user_types_it(typed, name, gib, gbps, backend, unified):
    card = card_named(typed)
    assert (card.name, card.memory_bytes, card.gbps, card.backend, card.unified) == (
        name, gib * 2**30, gbps, backend, unified)  # fmt: skip


@pytest.mark.parametrize(
    ("typed", "says"),
    [("RTX 3080", "RTX 3080 10GB or RTX 3080 12GB"), ("M4 Pro", "M4 Pro 24GB or M4 Pro 48GB or M4 Pro 64GB"),
     ("M4 Pro 40GB", "several memory sizes"), ("Voodoo 5", "not in moeplace's table")],
)  # fmt: skip
def test_a_name_that_is_not_one_card_gets_one_line(typed, says):
    with pytest.raises(MoeplaceError) as raised:
        card_named(typed)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_every_unified_card_is_an_apple_chip_or_an_apu_and_none_else():
    unified = {row.name for row in CARDS if row.unified}
    assert all(name.startswith(("M1", "M2", "M3", "M4", "Radeon 8060S")) for name in unified)
    assert not any(row.name.startswith(("M1 ", "M2 ", "M3 ", "M4 ")) for row in CARDS if not row.unified)
    assert "RX 7900 XTX" not in unified and "M3 Max 48GB" in unified


def test_an_igpu_printed_with_graphics_gets_its_datasheet():
    assert datasheet("Radeon 8060S Graphics").gbps == 256  # vulkan-strix-halo-radv-init-free.txt
    assert datasheet("Intel(R) Arc(TM) B580 Graphics").gbps == 456
