"""Options several subcommands share: the model reference and the speed model's machine."""

from __future__ import annotations

import argparse

from ..plan.machine import DEFAULT_BANDWIDTHS, DEFAULT_CARD_TFLOPS, DEFAULT_LINK_GBPS
from ..plan.request import Speeds

MODEL_HELP = "a .gguf path (any shard of a split model), URL, ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO or hf:ORG/REPO"


def speeds(args: argparse.Namespace) -> Speeds:
    given = {k: getattr(args, k, None) for k in ("calibration", "bw_ddr_measured_gbps", "prior")}
    return Speeds(
        bw_vram_gbps=args.bw_vram_gbps,
        bw_ddr_gbps=args.bw_ddr_gbps,
        bw_link_gbps=args.bw_link_gbps,
        card_tflops=args.card_tflops,
        **given,
    )


def speed_options(parser: argparse.ArgumentParser, calibration: bool = True) -> None:
    if calibration:  # the commands whose speeds come from a calibration or the prior
        parser.add_argument("--calibration", help="a moeplace calibrate JSON: speeds fitted to your runs")
        parser.add_argument("--prior", help="a speed prior from moeplace prior learn (default: the shipped one)")
        parser.add_argument(
            "--bw-ddr-measured",
            dest="bw_ddr_measured_gbps",
            type=float,
            help="host RAM bandwidth, GB/s, as measured (STREAM, moeplace's membw), instead of --bw-ddr's datasheet "
            "figure",
        )
    parser.add_argument(
        "--bw-vram",
        "--bw-vram-gbps",
        dest="bw_vram_gbps",
        type=float,
        help=f"card memory bandwidth, GB/s, where no calibration says (default {DEFAULT_BANDWIDTHS[0]:g})",
    )
    parser.add_argument(
        "--bw-ddr",
        "--bw-ddr-gbps",
        dest="bw_ddr_gbps",
        type=float,
        help=f"host RAM bandwidth, GB/s, its datasheet (theoretical) figure, where no calibration says (default "
        f"{DEFAULT_BANDWIDTHS[1]:g})",
    )
    parser.add_argument(
        "--bw-link",
        "--bw-link-gbps",
        dest="bw_link_gbps",
        type=float,
        help=f"the card's PCIe link, GB/s, that prefill copies host experts over (default {DEFAULT_LINK_GBPS:g}: "
        "PCIe 4.0 x16)",
    )
    parser.add_argument(
        "--card-tflops",
        dest="card_tflops",
        type=float,
        help=f"the card's FP32 throughput, TFLOPS, that prefill computes at (default: the card's datasheet where "
        f"--vram auto finds it, else {DEFAULT_CARD_TFLOPS:g}: the seed's RX 9070 XT)",
    )
