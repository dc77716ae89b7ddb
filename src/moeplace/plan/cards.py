"""Datasheet memory bandwidth and FP32 throughput of current cards, found from the name nvidia-smi, rocm-smi or
llama.cpp prints.

The speed model's prior needs the card's bandwidth (decode) and its compute (prefill); a user who plans for the
machine they are on should not have to look them up. Each value is the vendor's specification (bus width x memory
data rate for GDDR cards, the stated figure for HBM cards; FP32 shader TFLOPS at the boost clock, which for AMD's
RDNA 3/4 counts dual issue), typed by hand from the vendor's product page named in `SOURCES`. A name that is
ambiguous (the RTX 3080 and 3060 were sold with two memory buses under one name; Apple's M-series Max chips with
two, so an Apple chip is named with its memory, "M4 Pro 48GB") or absent gives None: the caller keeps its defaults
and says so. A card marked unified (Apple's M chips, AMD's APUs) has no memory of its own: its GPU uses the system's
RAM, one pool with the host.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..core.backends import backend as backend_record
from ..core.backends import native
from ..core.errors import MoeplaceError

SOURCES = {
    "nvidia-geforce": "nvidia.com, GeForce RTX 20/30/40/50 series specifications",
    "nvidia-pro": "nvidia.com, RTX professional and data-center GPU datasheets",
    "amd": "amd.com, Radeon RX and Instinct product specifications",
    "intel": "intel.com, Arc A/B-series and Arc Pro product specifications",
    "apple": "apple.com, the chip's press release and the Mac's technical specifications",
    # Apple states no FP32 figure for M3 and M4 chips: GPU cores x 128 FP32 lanes x 2 x the GPU clock (1.398 GHz
    # for M3, 1.578 GHz for M4, as measured and published by third parties); memory and bandwidth are Apple's.
    "apple-computed": "apple.com (memory, bandwidth); FP32 computed from GPU cores and clock",
}


class Row(NamedTuple):
    """One card of the table: its name as the tools print it, without the vendor's brand words; memory GB/s; FP32
    TFLOPS; source key; memory GiB (None where one name was sold with several sizes: the names with the size, such
    as "RTX 4060 Ti 16GB", are for --card); unified: the GPU's memory is the system's RAM (Apple's M chips, AMD's
    APUs), one pool shared with the host."""

    name: str
    gbps: float
    tflops: float
    source: str
    memory: int | None
    unified: bool = False


def _apple(chip: str, sizes: tuple[int, ...], gbps: float, tflops: float, source: str = "apple") -> tuple[Row, ...]:
    """An Apple chip as sold with each memory size ("M4 Pro 48GB"): unified memory, the whole RAM one pool."""
    return tuple(Row(f"{chip} {size}GB", gbps, tflops, source, size, unified=True) for size in sizes)


CARDS: tuple[Row, ...] = tuple(
    Row(*row)
    for row in (
        ("RTX 5090", 1792, 104.8, "nvidia-geforce", 32),  # 512-bit GDDR7, 28 Gbps
        ("RTX 5080", 960, 56.3, "nvidia-geforce", 16),  # 256-bit, 30 Gbps
        ("RTX 5070 Ti", 896, 43.9, "nvidia-geforce", 16),  # 256-bit, 28 Gbps
        ("RTX 5070", 672, 30.9, "nvidia-geforce", 12),  # 192-bit, 28 Gbps
        ("RTX 5060 Ti", 448, 23.7, "nvidia-geforce", None),  # 128-bit, 28 Gbps
        ("RTX 5060 Ti 16GB", 448, 23.7, "nvidia-geforce", 16),  # the two memory sizes, for --card
        ("RTX 5060 Ti 8GB", 448, 23.7, "nvidia-geforce", 8),
        ("RTX 5060", 448, 19.2, "nvidia-geforce", 8),  # 128-bit, 28 Gbps
        ("RTX 4090", 1008, 82.6, "nvidia-geforce", 24),  # 384-bit GDDR6X, 21 Gbps
        ("RTX 4090 D", 1008, 73.5, "nvidia-geforce", 24),  # 384-bit, 21 Gbps
        ("RTX 4090 Laptop GPU", 576, 33, "nvidia-geforce", 16),  # 256-bit, 18 Gbps
        ("RTX 4080 SUPER", 736, 52.2, "nvidia-geforce", 16),  # 256-bit, 23 Gbps
        ("RTX 4080", 716.8, 48.7, "nvidia-geforce", 16),  # 256-bit, 22.4 Gbps
        ("RTX 4070 Ti SUPER", 672, 44.1, "nvidia-geforce", 16),  # 256-bit, 21 Gbps
        ("RTX 4070 Ti", 504, 40.1, "nvidia-geforce", 12),  # 192-bit, 21 Gbps
        ("RTX 4070 SUPER", 504, 35.5, "nvidia-geforce", 12),  # 192-bit, 21 Gbps
        ("RTX 4070", 504, 29.1, "nvidia-geforce", 12),  # 192-bit, 21 Gbps
        ("RTX 4060 Ti", 288, 22.1, "nvidia-geforce", None),  # 128-bit, 18 Gbps
        ("RTX 4060 Ti 16GB", 288, 22.1, "nvidia-geforce", 16),
        ("RTX 4060 Ti 8GB", 288, 22.1, "nvidia-geforce", 8),
        ("RTX 4060", 272, 15.1, "nvidia-geforce", 8),  # 128-bit, 17 Gbps
        ("RTX 4060 Laptop GPU", 256, 11.6, "nvidia-geforce", 8),  # 128-bit, 16 Gbps; FP32 at the 1890 MHz boost
        ("RTX 3090 Ti", 1008, 40, "nvidia-geforce", 24),  # 384-bit GDDR6X, 21 Gbps
        ("RTX 3090", 936, 35.6, "nvidia-geforce", 24),  # 384-bit, 19.5 Gbps
        ("RTX 3080 Ti", 912, 34.1, "nvidia-geforce", 12),  # 384-bit, 19 Gbps
        ("RTX 3080 12GB", 912, 30.6, "nvidia-geforce", 12),  # 384-bit, 19 Gbps
        ("RTX 3080 10GB", 760, 29.8, "nvidia-geforce", 10),  # 320-bit, 19 Gbps: one name, two buses
        ("RTX 3070 Ti", 608, 21.7, "nvidia-geforce", 8),  # 256-bit, 19 Gbps
        ("RTX 3070", 448, 20.3, "nvidia-geforce", 8),  # 256-bit GDDR6, 14 Gbps
        ("RTX 3060 Ti", 448, 16.2, "nvidia-geforce", 8),  # 256-bit, 14 Gbps
        ("RTX 3060 12GB", 360, 12.7, "nvidia-geforce", 12),  # 192-bit, 15 Gbps
        ("RTX 3060 8GB", 240, 12.7, "nvidia-geforce", 8),  # 128-bit, 15 Gbps
        ("RTX 3050", 224, 9.1, "nvidia-geforce", 8),  # 128-bit, 14 Gbps
        ("RTX 2080 Ti", 616, 13.4, "nvidia-geforce", 11),  # 352-bit GDDR6, 14 Gbps
        ("RTX 2060 12GB", 336, 7.2, "nvidia-geforce", 12),  # 192-bit, 14 Gbps
        ("GTX 1080 Ti", 484, 11.3, "nvidia-geforce", 11),  # 352-bit GDDR5X, 11 Gbps
        ("P40", 346, 11.8, "nvidia-pro", 24),  # Tesla P40: 384-bit GDDR5
        ("P100-PCIE-16GB", 732, 9.3, "nvidia-pro", 16),  # HBM2
        ("V100-PCIE-32GB", 900, 14, "nvidia-pro", 32),  # HBM2
        ("RTX PRO 6000 Blackwell Workstation Edition", 1792, 125, "nvidia-pro", 96),  # 512-bit GDDR7, 28 Gbps
        ("RTX PRO 6000 Blackwell Max-Q Workstation Edition", 1792, 110, "nvidia-pro", 96),
        ("RTX PRO 6000 Blackwell Server Edition", 1792, 120, "nvidia-pro", 96),
        ("RTX PRO 4000 Blackwell", 672, 46.9, "nvidia-pro", 24),  # 192-bit GDDR7
        ("RTX 6000 Ada Generation", 960, 91.1, "nvidia-pro", 48),  # 384-bit GDDR6
        ("RTX A6000", 768, 38.7, "nvidia-pro", 48),  # 384-bit GDDR6
        ("L40S", 864, 91.6, "nvidia-pro", 48),
        ("L4", 300, 30.3, "nvidia-pro", 24),
        ("A10", 600, 31.2, "nvidia-pro", 24),
        ("T4", 320, 8.1, "nvidia-pro", 16),
        ("A100-SXM4-80GB", 2039, 19.5, "nvidia-pro", 80),
        ("A100 80GB PCIe", 1935, 19.5, "nvidia-pro", 80),
        ("A100-SXM4-40GB", 1555, 19.5, "nvidia-pro", 40),
        ("A100-PCIE-40GB", 1555, 19.5, "nvidia-pro", 40),
        ("H100 80GB HBM3", 3350, 67, "nvidia-pro", 80),  # SXM
        ("H100 PCIe", 2000, 51, "nvidia-pro", 80),
        ("H200", 4800, 67, "nvidia-pro", 140),  # sold as 141 GB; nvidia-smi shows 143,771 MiB
        ("RX 9070 XT", 640, 48.7, "amd", 16),  # 256-bit GDDR6, 20 Gbps
        ("RX 9070", 640, 36.1, "amd", 16),
        ("RX 7900 XTX", 960, 61.4, "amd", 24),  # 384-bit, 20 Gbps
        ("RX 7900 XT", 800, 51.5, "amd", 20),  # 320-bit, 20 Gbps
        ("RX 7900 GRE", 576, 46, "amd", 16),  # 256-bit, 18 Gbps
        ("RX 7800 XT", 624, 37.3, "amd", 16),  # 256-bit, 19.5 Gbps
        ("RX 7700 XT", 432, 35.2, "amd", 12),  # 192-bit, 18 Gbps
        ("RX 7600", 288, 21.8, "amd", 8),  # 128-bit, 18 Gbps
        ("RX 6900 XT", 512, 23, "amd", 16),  # 256-bit, 16 Gbps
        ("RX 6800 XT", 512, 20.7, "amd", 16),
        ("RX 6800", 512, 16.2, "amd", 16),  # 256-bit, 16 Gbps
        ("RX 9060 XT 16GB", 320, 25.6, "amd", 16),  # 128-bit, 20 Gbps
        ("RX 9060 XT 8GB", 320, 25.6, "amd", 8),
        ("RX 7600 XT", 288, 22.6, "amd", 16),  # 128-bit, 18 Gbps
        ("RX 6950 XT", 576, 23.7, "amd", 16),  # 256-bit, 18 Gbps
        ("RX 6750 XT", 432, 13.3, "amd", 12),  # 192-bit, 18 Gbps
        ("RX 6700 XT", 384, 13.2, "amd", 12),  # 192-bit, 16 Gbps
        ("RX 6600 XT", 256, 10.6, "amd", 8),  # 128-bit, 16 Gbps
        ("RX 6600", 224, 8.9, "amd", 8),  # 128-bit, 14 Gbps
        ("Radeon VII", 1024, 13.8, "amd", 16),  # HBM2
        ("MI50", 1024, 13.3, "amd", None),  # Instinct MI50: HBM2, sold with 16 and 32 GB
        ("MI50 16GB", 1024, 13.3, "amd", 16),
        ("MI50 32GB", 1024, 13.3, "amd", 32),
        # Ryzen AI Max's GPU: the system's 256-bit LPDDR5X-8000, the RAM one pool with the host; FP32 dual issue
        ("Radeon 8060S", 256, 29.7, "amd", None, True),
        ("Radeon 8060S 32GB", 256, 29.7, "amd", 32, True),
        ("Radeon 8060S 64GB", 256, 29.7, "amd", 64, True),
        ("Radeon 8060S 128GB", 256, 29.7, "amd", 128, True),
        ("PRO W7900", 864, 61.3, "amd", 48),
        ("MI300X", 5300, 163.4, "amd", 192),
        ("Arc A770 16GB", 560, 17.2, "intel", 16),  # 256-bit, 17.5 Gbps
        ("Arc A770 8GB", 512, 17.2, "intel", 8),  # 256-bit, 16 Gbps
        ("Arc A750", 512, 14.7, "intel", 8),  # 256-bit, 16 Gbps
        ("Arc A380", 186, 4.1, "intel", 6),  # 96-bit, 15.5 Gbps
        ("Arc B580", 456, 13.7, "intel", 12),  # 192-bit, 19 Gbps
        ("Arc B570", 380, 11.5, "intel", 10),  # 160-bit, 19 Gbps
        ("Arc Pro B50", 224, 10.6, "intel", 16),  # 128-bit, 14 Gbps
        ("Arc Pro B60", 456, 12.3, "intel", 24),  # 192-bit, 19 Gbps
    )
) + (
    # Apple's M chips: unified memory (LPDDR), the bandwidth Apple states; FP32 as Apple states it for M1 and M2
    # (the largest GPU sold with that memory size).
    *_apple("M1 Pro", (16, 32), 200, 5.2),
    *_apple("M1 Max", (32, 64), 400, 10.4),
    *_apple("M1 Ultra", (64, 128), 800, 21),
    *_apple("M2", (8, 16, 24), 100, 3.6),
    *_apple("M2 Pro", (16, 32), 200, 6.8),
    *_apple("M2 Max", (32, 64, 96), 400, 13.6),
    *_apple("M2 Ultra", (64, 128, 192), 800, 27.2),
    *_apple("M3", (8, 16, 24), 100, 3.6, "apple-computed"),  # 10-core GPU
    *_apple("M3 Pro", (18, 36), 150, 6.4, "apple-computed"),  # 18-core GPU
    *_apple("M3 Max", (36, 96), 300, 10.7, "apple-computed"),  # the 30-core GPU, 384-bit memory
    *_apple("M3 Max", (48, 64, 128), 400, 14.3, "apple-computed"),  # the 40-core GPU, 512-bit memory
    *_apple("M3 Ultra", (96,), 819, 21.5, "apple-computed"),  # 60-core GPU
    *_apple("M3 Ultra", (256, 512), 819, 28.6, "apple-computed"),  # 80-core GPU
    *_apple("M4", (16, 24, 32), 120, 4, "apple-computed"),  # 10-core GPU
    *_apple("M4 Pro", (24, 48, 64), 273, 8.1, "apple-computed"),  # 20-core GPU
    *_apple("M4 Max", (36,), 410, 12.9, "apple-computed"),  # the 32-core GPU, 384-bit memory
    *_apple("M4 Max", (48, 64, 128), 546, 16.2, "apple-computed"),  # the 40-core GPU, 512-bit memory
)


def _words(name: str) -> list[str]:
    """A card name's words, case and punctuation aside ("NVIDIA GeForce RTX 4090" -> nvidia geforce rtx 4090)."""
    return re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", name.lower())


def _sheet(card: str, source: str) -> str:
    return f"{card}'s datasheet ({SOURCES[source]})"


class Datasheet(NamedTuple):
    gbps: float  # memory bandwidth
    tflops: float  # FP32
    source: str


def datasheet(name: str) -> Datasheet | None:
    """The datasheet of the card `name` as a tool prints it, or None where the table does not know it. The longest
    table name whose words end the printed name's matches, so "RTX 4070 Ti SUPER" is not read as an RTX 4070 Ti, and
    a laptop chip never as its desktop namesake."""
    words = [w for w in _words(name) if w not in ("graphics", "r", "tm")]  # "Intel(R) Arc(TM) B580 Graphics"
    for row in sorted(CARDS, key=lambda c: -len(_words(c.name))):
        key = _words(row.name)
        if words[-len(key) :] == key:
            return Datasheet(row.gbps, row.tflops, _sheet(row.name, row.source))
    return None


class Card(NamedTuple):
    """A card as --card names it: its memory, datasheet and llama.cpp backend."""

    name: str
    memory_bytes: int
    gbps: float
    tflops: float
    backend: str
    source: str
    unified: bool = False  # the GPU's memory is the system's RAM: one pool with the host (Apple's M chips, APUs)

    @property
    def backends(self) -> tuple[str, ...]:
        """The llama.cpp backends that run this card: its vendor's, Vulkan (not on a Mac), or behind an RPC
        server."""
        return (self.backend, "rpc") if backend_record(self.backend).unified else (self.backend, "vulkan", "rpc")


_BRANDS = {"nvidia", "geforce", "amd", "radeon", "intel", "apple", "tesla", "instinct"}


def _typed_words(name: str) -> list[str]:
    """A name as a user types it, brand words aside, letters and digits apart: 'GeForce RTX4070 Ti Super' -> rtx
    4070 ti super, '7900xtx' -> 7900 xtx, 'M4 Pro 48 GB' -> m 4 pro 48gb."""
    text = re.sub(r"([a-z])(\d)", r"\1 \2", re.sub(r"(\d)([a-z])", r"\1 \2", name.lower()))
    text = re.sub(r"(\d+)\s*gb\b", r"\1gb", text)
    return [w for w in _words(text) if w not in _BRANDS]


def card_named(text: str) -> Card:
    """The card a user names (`--card "4070 Ti Super"`, "RTX 3060 12GB"): the table's card whose name ends with
    the words typed, a size typed after it checked against the card's. One line naming what to type otherwise."""
    words = _typed_words(text)
    size = words.pop() if words and re.fullmatch(r"\d+gb", words[-1]) else None
    rows = {tuple(_typed_words(c.name)): c for c in CARDS}
    found = [key for key in rows if key[-len(words) :] == tuple(words)] if words else []
    exact = [key for key in found if key == tuple(words)]
    if size and (sized := [key for key in rows if key[-len(words) - 1 :] == (*words, size)]):
        found = exact = sized
    if len(exact) == 1 or len(found) == 1:
        row = rows[(exact or found)[0]]
        name, memory = row.name, row.memory
    elif found:
        names = ", ".join(sorted(rows[k].name for k in found))
        raise MoeplaceError(f"--card {text!r} names several cards ({names}); type the whole name.")
    elif sizes := sorted(
        rows[k].name for k in rows if re.fullmatch(r"\d+gb", k[-1]) and k[-len(words) - 1 : -1] == tuple(words)
    ):
        raise MoeplaceError(f"--card {text!r} was sold with several memory sizes; type yours: {' or '.join(sizes)}.")
    else:
        raise MoeplaceError(
            f"--card {text!r}: not in moeplace's table of cards (plan/cards.py); give --vram SIZE "
            "and --bw-vram/--card-tflops, or a name such as 'RTX 4070 Ti SUPER' or "
            "'RX 7900 XTX'."
        )
    if memory is None:
        raise MoeplaceError(
            f"--card {text!r}: the {name} was sold with several memory sizes; add yours, e.g. --card '{name} 16GB'."
        )
    if size and int(size[:-2]) != memory:
        raise MoeplaceError(f"--card {text!r}: the {name} has {memory} GB, not {size[:-2]}; check the name.")
    backend = native(row.source.split("-")[0])  # a source key starts with the maker: nvidia-pro, apple-computed
    return Card(name, memory * 2**30, row.gbps, row.tflops, backend, _sheet(name, row.source), row.unified)
