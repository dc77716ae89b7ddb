"""recommend's flags, read once into one Request (plan/request.py), which is all the plan takes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core.backends import NAMES as BACKEND_NAMES
from ..core.errors import MoeplaceError
from ..model.draft import DRAFT_MAX, SPEC_TYPES, DraftRequest
from ..model.kvcache import CACHE_TYPES
from ..model.memory import FLASH_ATTN
from ..plan.emit_formats import EMIT_FORMATS
from ..plan.emit_formats import NAMES as EMIT_NAMES
from ..plan.recommend import recommend
from ..plan.request import Constants, Request, parse_contexts
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_FLASH_ATTN, DEFAULT_UBATCH
from .options import MODEL_HELP, speed_options, speeds
from .recommend_text import render

_CONSTANTS = ("vram_gb", "non_expert_gb", "expert_gb", "layers", "kv_bytes_per_token")


def request_from_args(args: argparse.Namespace) -> Request:
    """recommend's flags as one Request, checked: the only thing the plan reads."""
    given = [f for f in _CONSTANTS if getattr(args, f) is not None]
    constants = None
    if given and not args.model:
        missing = [f for f in _CONSTANTS if getattr(args, f) is None]
        if missing:
            raise MoeplaceError(
                "give a MODEL.gguf, or all of "
                + ", ".join("--" + m.replace("_", "-") for m in missing)
                + " for the constants mode."
            )
        constants = Constants(**{f: getattr(args, f) for f in _CONSTANTS}, overhead_gb=args.overhead_gb)
    elif given:
        raise MoeplaceError(
            f"--{given[0].replace('_', '-')} belongs to the constants mode, which has no model file: "
            "give a MODEL.gguf with --vram, or the constants alone."
        )
    longest = args.ctx.strip() == "max"
    vram = None if args.vram in (None, "auto") else tuple(v.strip() for v in args.vram.split(","))
    return Request(
        contexts=() if longest else parse_contexts(args.ctx),
        model=args.model,
        model_ref=getattr(args, "model_ref", None),
        longest=longest,
        vram=vram,
        auto=args.vram == "auto",
        card=args.card,
        backend=args.backend,
        margin_mib=args.margin,
        ram=args.ram,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        flash_attn=args.flash_attn,
        ubatch=args.ubatch,
        parallel=args.parallel,
        mmproj=args.mmproj,
        overrides=tuple(args.override_tensor),
        no_kv_offload=args.no_kv_offload,
        emit=args.emit,
        json=args.json,
        placement=args.placement,
        objective=args.objective,
        reserve=args.reserve,
        bin_dir=args.bin_dir,
        speeds=speeds(args),
        constants=constants,
        draft=DraftRequest(
            args.model_draft,
            args.spec_type,
            args.draft_max,
            args.cache_type_k_draft,
            args.cache_type_v_draft,
            args.ctx_size_draft,
            args.gpu_layers_draft,
        ),
        unified=args.unified,
        wired_limit_mib=args.wired_limit,
    )


def cmd_recommend(args: argparse.Namespace) -> int:
    """Print the plan as --emit asks, each context that does not fit on stderr with its fixes: 1 where one does
    not fit."""
    rec = recommend(request_from_args(args))
    for line in rec.errors():
        print(line if line.startswith("  ") else f"moeplace: {line}", file=sys.stderr)
    if rec.request.emit == "bench":  # the lines alone on stdout, to paste: what they differ by on stderr
        for p in rec.fitting:
            for note in p.get("notes", []):
                print(f"note: {note}", file=sys.stderr)
    sys.stdout.write(render(rec))
    return 0 if rec.fits else 1


def add_parser(sub: Any) -> None:
    """recommend: the allocator's flags."""
    rec = sub.add_parser("recommend", help="the minimum --n-cpu-moe that fits your card at each context")
    rec.add_argument("model", nargs="?", help=MODEL_HELP + "; omit to use the constants below")
    rec.add_argument(
        "--ctx",
        required=True,
        help="context length(s) per slot, comma-separated, e.g. 8192,32768; max: the longest that fits",
    )
    rec.add_argument(
        "--vram",
        help="the card's memory, e.g. 16GiB (a card sold as 16 GB), or A,B for several cards, or auto: this GPU's "
        "free memory now",
    )
    rec.add_argument(
        "--card",
        help="a card by name, e.g. '4070 Ti Super' or 'RTX 3060 12GB': its memory, "
        "bandwidth, TFLOPS and backend from moeplace's table (plan/cards.py)",
    )
    rec.add_argument(
        "--backend",
        choices=("auto", *BACKEND_NAMES),
        default="auto",
        help="the card's llama.cpp backend, for its default margin (auto: this machine's GPU)",
    )
    rec.add_argument(
        "--margin",
        type=int,
        help="MiB kept free on the card beyond llama.cpp's buffers "
        "(default: the backend's, from real cards; 0 on the emulated device, rpc)",
    )
    rec.add_argument("--ram", help="the host's RAM for the experts left there, e.g. 64GB (default: this machine's)")
    rec.add_argument(
        "--unified",
        action="store_true",
        help="the GPU is an APU whose memory is the RAM (ROCm, Vulkan): --vram is then the machine's RAM, one pool "
        "(Metal always is; docs/devices.md)",
    )
    rec.add_argument(
        "--wired-limit",
        type=int,
        metavar="MIB",
        help="unified memory: the GPU's working-set cap you set (sudo sysctl iogpu.wired_limit_mb=N; an APU's "
        "GTT limit), in MiB (default: the OS's default share of the RAM)",
    )
    _llamacpp_options(rec)
    _draft_options(rec)
    _placement_options(rec)
    rec.set_defaults(func=cmd_recommend)


def _llamacpp_options(rec: argparse.ArgumentParser) -> None:
    """What llama.cpp is run with (flash attention, slots, projector, pins, KV cache, ubatch, its own reserve) and
    what is printed."""
    rec.add_argument(
        "--flash-attn", choices=FLASH_ATTN, default=DEFAULT_FLASH_ATTN, help="llama.cpp's -fa (auto: on on GPUs)"
    )
    rec.add_argument("--parallel", type=int, default=1, help="llama-server --parallel slots, each with --ctx tokens")
    rec.add_argument("--mmproj", help="a vision projector .gguf the server also loads onto the card")
    rec.add_argument(
        "-ot",
        "--override-tensor",
        action="append",
        default=[],
        metavar="REGEX=BUFFER,...",
        help="your own pins as llama.cpp takes them (REGEX=CPU or a device such as CUDA0; ',' between rules; "
        "repeatable): kept first in every command, and the minimum --n-cpu-moe planned around them",
    )
    rec.add_argument(
        "-nkvo", "--no-kv-offload", action="store_true", help="keep the KV cache in host RAM (llama.cpp's -nkvo)"
    )
    rec.add_argument("-ctk", "--cache-type-k", default=DEFAULT_CACHE_TYPE, choices=CACHE_TYPES)
    rec.add_argument("-ctv", "--cache-type-v", default=DEFAULT_CACHE_TYPE, choices=CACHE_TYPES)
    rec.add_argument("--json", action="store_true", help="print the plan per context as JSON (= --emit json)")
    rec.add_argument(
        "--emit",
        choices=EMIT_NAMES,
        default="server",
        help="what to print: " + "; ".join(f"{f.name}: {f.what}" for f in EMIT_FORMATS),
    )
    rec.add_argument(
        "--ubatch", type=int, default=DEFAULT_UBATCH, help="llama.cpp's ubatch (-ub): compute buffer and prefill"
    )
    rec.add_argument(
        "--reserve",
        action="store_true",
        help="llama.cpp's own compute buffer instead of our estimate "
        "(the pinned build, built once, or --bin-dir's; ~1 s a context): llama-bench's exactly, an upper "
        "bound for llama-server, which reserves logits for one token per slot",
    )
    rec.add_argument("--bin-dir", help="your llama.cpp build's bin/ for --reserve (default: the pinned build)")


def _draft_options(rec: argparse.ArgumentParser) -> None:
    """Speculative decoding, as llama-server takes it (its buffers planned beside the model's: model/draft.py)."""
    group = rec.add_argument_group("speculative decoding (llama-server's draft context, planned on the card)")
    group.add_argument("-md", "--model-draft", help="a draft model .gguf (its vocabulary must be the model's)")
    group.add_argument(
        "--spec-type",
        choices=SPEC_TYPES,
        help="llama.cpp's speculation: draft-simple (with -md, the default then) or draft-mtp (the model's own "
        "MTP/NextN head)",
    )
    group.add_argument(
        "--draft-max", type=int, default=DRAFT_MAX, help="tokens drafted a step (llama.cpp's --spec-draft-n-max)"
    )
    group.add_argument("-ctkd", "--cache-type-k-draft", default="f16", choices=CACHE_TYPES)
    group.add_argument("-ctvd", "--cache-type-v-draft", default="f16", choices=CACHE_TYPES)
    group.add_argument(
        "-ngld", "--gpu-layers-draft", default="all", help="the draft's layers on the card: all (planned whole)"
    )
    group.add_argument(
        "-cd", "--ctx-size-draft", type=int, help="older llama.cpp's draft context (refused: the pinned build has none)"
    )


def _placement_options(rec: argparse.ArgumentParser) -> None:
    """--placement optimal, its objective, the speed model's machine and the seed's constants mode."""
    rec.add_argument(
        "--objective",
        help="what --placement optimal ranks by: decode (default), prefill or mix:W (0 < W < 1, the share of decode "
        "tokens); only with --placement optimal",
    )
    rec.add_argument(
        "--placement",
        choices=("ncmoe", "optimal"),
        default="ncmoe",
        help="optimal: also the -ot placements keeping the most expert bytes on the card, your pins kept",
    )
    speed_options(rec)
    const = rec.add_argument_group("constants mode (the seed's script)")
    const.add_argument("--vram-gb", type=float)
    const.add_argument("--non-expert-gb", type=float)
    const.add_argument("--expert-gb", type=float)
    const.add_argument("--layers", type=int)
    const.add_argument("--overhead-gb", type=float, default=1.0)
    const.add_argument("--kv-bytes-per-token", type=int)
