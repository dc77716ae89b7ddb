"""The machine a plan assumes where the user does not say: moeplace's defaults (the seed's workstation), or for
--vram auto this machine's own: its card's datasheet, found from the name, and its host RAM, measured."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import NamedTuple

from ..core.config_schema import default
from ..core.errors import MoeplaceError
from ..core.units import parse_size
from ..runtime.native import ram_read_gbps
from .cards import datasheet

# The seed's workstation (640 GB/s card, dual-channel DDR5 at the config's default host figure, 57.6 GB/s): the
# bandwidths a plan assumes when neither a calibration nor the user's own figures say otherwise.
DEFAULT_BANDWIDTHS = (640.0, float(default("host.bw_ddr_gbps")))
DEFAULT_LINK_GBPS = 31.5  # PCIe 4.0 x16, one direction: what prefill copies host experts over
DEFAULT_CARD_TFLOPS = 48.7  # the seed's RX 9070 XT (FP32, AMD's figure): what prefill computes at
# The host RAM probe of a plan for this machine: larger than any CPU cache, ~1.5 s in all.
HOST_PROBE_BYTES, HOST_PROBE_S = 256 * 2**20, 1.5


def host_ram(ram_flag: str | None) -> tuple[int | None, str]:
    """The host's RAM: --ram as given, else this machine's total."""
    if ram_flag:
        return parse_size(ram_flag, "--ram"), f"--ram {ram_flag}"
    try:
        total = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
        return int(total.split()[1]) * 1024, "this machine's, /proc/meminfo"
    except (OSError, StopIteration, ValueError, IndexError):
        return None, "unknown (give --ram)"


class ThisMachine(NamedTuple):
    vram_gbps: float
    ddr_gbps: float
    tflops: float
    said: str
    ddr_measured: bool  # the host figure was measured here (else moeplace's default, a datasheet figure)


def this_machine(card: str) -> ThisMachine:
    """The bandwidths and card compute of the machine a plan is for (--vram auto): the card's datasheet, found
    from its name, and the host's RAM read measured here; each falls back to moeplace's default, saying why."""
    if sheet := datasheet(card):
        vram, tflops, vram_from = sheet.gbps, sheet.tflops, f"the card: {sheet.source}"
    else:
        vram, tflops = DEFAULT_BANDWIDTHS[0], DEFAULT_CARD_TFLOPS
        vram_from = (
            f"the card: {card} is not in moeplace's table of cards, so moeplace's defaults, --bw-vram and "
            "--card-tflops for yours"
        )
    threads = len(os.sched_getaffinity(0))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ddr = ram_read_gbps(Path(tmp) / "membw.log", threads, HOST_PROBE_BYTES, HOST_PROBE_S)
        ddr_from = (
            f"the host: measured here ({threads} threads reading {HOST_PROBE_BYTES >> 20} MiB, best of 3), "
            "a measured figure, not discounted as a datasheet's"
        )
        measured = True
    except MoeplaceError as e:
        ddr, ddr_from = DEFAULT_BANDWIDTHS[1], f"the host: moeplace's default ({e}), --bw-ddr for yours"
        measured = False
    return ThisMachine(vram, ddr, tflops, f"{vram_from}; {ddr_from}", measured)
