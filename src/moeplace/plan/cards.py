"""Datasheet memory bandwidth and FP32 throughput of current cards, found from the name nvidia-smi, rocm-smi or
llama.cpp prints.

The speed model's prior needs the card's bandwidth (decode) and its compute (prefill); a user who plans for the
machine they are on should not have to look them up. Each value is the vendor's specification (bus width x memory
data rate for GDDR cards, the stated figure for HBM cards; FP32 shader TFLOPS at the boost clock, which for AMD's
RDNA 3/4 counts dual issue), typed by hand from the vendor's product page named in `SOURCES`. A name that is
ambiguous (the RTX 3080 and 3060 were sold with two memory buses under one name; Apple's M-series Max chips with
two) or absent gives None: the caller keeps its defaults and says so.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SOURCES = {
    "nvidia-geforce": "nvidia.com, GeForce RTX 20/30/40/50 series specifications",
    "nvidia-pro": "nvidia.com, RTX professional and data-center GPU datasheets",
    "amd": "amd.com, Radeon RX and Instinct product specifications",
}

# (name as the tools print it, without the vendor's brand words; memory GB/s; FP32 TFLOPS; source key)
CARDS: tuple[tuple[str, float, float, str], ...] = (
    ("RTX 5090", 1792, 104.8, "nvidia-geforce"),  # 512-bit GDDR7, 28 Gbps
    ("RTX 5080", 960, 56.3, "nvidia-geforce"),  # 256-bit, 30 Gbps
    ("RTX 5070 Ti", 896, 43.9, "nvidia-geforce"),  # 256-bit, 28 Gbps
    ("RTX 5070", 672, 30.9, "nvidia-geforce"),  # 192-bit, 28 Gbps
    ("RTX 5060 Ti", 448, 23.7, "nvidia-geforce"),  # 128-bit, 28 Gbps
    ("RTX 5060", 448, 19.2, "nvidia-geforce"),  # 128-bit, 28 Gbps
    ("RTX 4090", 1008, 82.6, "nvidia-geforce"),  # 384-bit GDDR6X, 21 Gbps
    ("RTX 4090 D", 1008, 73.5, "nvidia-geforce"),  # 384-bit, 21 Gbps
    ("RTX 4090 Laptop GPU", 576, 33, "nvidia-geforce"),  # 256-bit, 18 Gbps
    ("RTX 4080 SUPER", 736, 52.2, "nvidia-geforce"),  # 256-bit, 23 Gbps
    ("RTX 4080", 716.8, 48.7, "nvidia-geforce"),  # 256-bit, 22.4 Gbps
    ("RTX 4070 Ti SUPER", 672, 44.1, "nvidia-geforce"),  # 256-bit, 21 Gbps
    ("RTX 4070 Ti", 504, 40.1, "nvidia-geforce"),  # 192-bit, 21 Gbps
    ("RTX 4070 SUPER", 504, 35.5, "nvidia-geforce"),  # 192-bit, 21 Gbps
    ("RTX 4070", 504, 29.1, "nvidia-geforce"),  # 192-bit, 21 Gbps
    ("RTX 4060 Ti", 288, 22.1, "nvidia-geforce"),  # 128-bit, 18 Gbps
    ("RTX 4060", 272, 15.1, "nvidia-geforce"),  # 128-bit, 17 Gbps
    ("RTX 4060 Laptop GPU", 256, 11.6, "nvidia-geforce"),  # 128-bit, 16 Gbps; FP32 at the 1890 MHz boost
    ("RTX 3090 Ti", 1008, 40, "nvidia-geforce"),  # 384-bit GDDR6X, 21 Gbps
    ("RTX 3090", 936, 35.6, "nvidia-geforce"),  # 384-bit, 19.5 Gbps
    ("RTX 3080 Ti", 912, 34.1, "nvidia-geforce"),  # 384-bit, 19 Gbps
    ("RTX 3070 Ti", 608, 21.7, "nvidia-geforce"),  # 256-bit, 19 Gbps
    ("RTX 3070", 448, 20.3, "nvidia-geforce"),  # 256-bit GDDR6, 14 Gbps
    ("RTX 3060 Ti", 448, 16.2, "nvidia-geforce"),  # 256-bit, 14 Gbps
    ("RTX 2080 Ti", 616, 13.4, "nvidia-geforce"),  # 352-bit GDDR6, 14 Gbps
    ("RTX PRO 6000 Blackwell Workstation Edition", 1792, 125, "nvidia-pro"),  # 512-bit GDDR7, 28 Gbps
    ("RTX PRO 6000 Blackwell Max-Q Workstation Edition", 1792, 110, "nvidia-pro"),
    ("RTX PRO 6000 Blackwell Server Edition", 1792, 120, "nvidia-pro"),
    ("RTX PRO 4000 Blackwell", 672, 46.9, "nvidia-pro"),  # 192-bit GDDR7
    ("RTX 6000 Ada Generation", 960, 91.1, "nvidia-pro"),  # 384-bit GDDR6
    ("RTX A6000", 768, 38.7, "nvidia-pro"),  # 384-bit GDDR6
    ("L40S", 864, 91.6, "nvidia-pro"),
    ("L4", 300, 30.3, "nvidia-pro"),
    ("A10", 600, 31.2, "nvidia-pro"),
    ("T4", 320, 8.1, "nvidia-pro"),
    ("A100-SXM4-80GB", 2039, 19.5, "nvidia-pro"),
    ("A100 80GB PCIe", 1935, 19.5, "nvidia-pro"),
    ("A100-SXM4-40GB", 1555, 19.5, "nvidia-pro"),
    ("A100-PCIE-40GB", 1555, 19.5, "nvidia-pro"),
    ("H100 80GB HBM3", 3350, 67, "nvidia-pro"),  # SXM
    ("H100 PCIe", 2000, 51, "nvidia-pro"),
    ("H200", 4800, 67, "nvidia-pro"),
    ("RX 9070 XT", 640, 48.7, "amd"),  # 256-bit GDDR6, 20 Gbps
    ("RX 9070", 640, 36.1, "amd"),
    ("RX 7900 XTX", 960, 61.4, "amd"),  # 384-bit, 20 Gbps
    ("RX 7900 XT", 800, 51.5, "amd"),  # 320-bit, 20 Gbps
    ("RX 7900 GRE", 576, 46, "amd"),  # 256-bit, 18 Gbps
    ("RX 7800 XT", 624, 37.3, "amd"),  # 256-bit, 19.5 Gbps
    ("RX 7700 XT", 432, 35.2, "amd"),  # 192-bit, 18 Gbps
    ("RX 7600", 288, 21.8, "amd"),  # 128-bit, 18 Gbps
    ("RX 6900 XT", 512, 23, "amd"),  # 256-bit, 16 Gbps
    ("RX 6800 XT", 512, 20.7, "amd"),
    ("RX 6800", 512, 16.2, "amd"),  # 256-bit, 16 Gbps
    ("Radeon 8060S", 256, 29.7, "amd"),  # Ryzen AI Max's GPU: the system's 256-bit LPDDR5X-8000; FP32 dual issue
    ("PRO W7900", 864, 61.3, "amd"),
    ("MI300X", 5300, 163.4, "amd"),
)


def _words(name: str) -> list[str]:
    """A card name's words, case and punctuation aside ("NVIDIA GeForce RTX 4090" -> nvidia geforce rtx 4090)."""
    return re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", name.lower())


class Datasheet(NamedTuple):
    gbps: float  # memory bandwidth
    tflops: float  # FP32
    source: str


def datasheet(name: str) -> Datasheet | None:
    """The datasheet of the card `name` as a tool prints it, or None where the table does not know it. The longest
    table name whose words end the printed name's matches, so "RTX 4070 Ti SUPER" is not read as an RTX 4070 Ti, and
    a laptop chip never as its desktop namesake."""
    words = _words(name)
    for card, gbps, tflops, source in sorted(CARDS, key=lambda c: -len(_words(c[0]))):
        key = _words(card)
        if words[-len(key) :] == key:
            return Datasheet(gbps, tflops, f"{card}'s datasheet ({SOURCES[source]})")
    return None
