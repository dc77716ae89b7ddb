"""moeplace as a library: the answers the command line prints, as values. Each call takes what the command takes
(the same names as recommend's Request, checked the same way: a bad value raises MoeplaceError with one line) and
returns typed results that print nothing.

    import moeplace
    rec = moeplace.recommend("model.gguf", ctx=[8192, 32768], card="RTX 4070 Ti SUPER")
    for p in rec.plans:
        print(p["ctx"], p["n_cpu_moe"], p["commands"]["server"])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from .core.errors import MoeplaceError
from .model.draft import DraftRequest
from .model.meta import ModelMeta
from .model.metadata import inspect_model
from .plan import recommend as recommend_mod
from .plan.assumed import card_speed_model
from .plan.optimal import RankedPlacement
from .plan.predict import PredictedSpeed, predicted_speeds
from .plan.recommend import Plan, Recommendation
from .plan.request import Request, Speeds, check_ubatch
from .report.explain import Explanation
from .report.explain import explain as explain_text
from .runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_UBATCH

__all__ = [
    "DraftRequest",
    "Plan",
    "Recommendation",
    "Request",
    "Speeds",
    "explain",
    "inspect",
    "optimal",
    "predict",
    "recommend",
]

_OPTIONS = {f.name for f in fields(Request)} - {"contexts", "model", "vram"}


def recommend(
    model: str, *, ctx: int | Sequence[int], vram: str | Sequence[str] | None = None, **options: Any
) -> Recommendation:
    """`moeplace recommend MODEL --ctx ... --vram ...` as a value: per context the smallest --n-cpu-moe that fits,
    every device buffer, the speeds, the assumptions and each tool's command line. `vram`: '16GiB', several cards'
    sizes, or 'auto'; or give `card='RTX 3060 12GB'`. `options`: any other field of Request (backend, margin_mib,
    type_k, type_v, flash_attn, ubatch, parallel, overrides, placement, objective, speeds, unified,
    wired_limit_mib, ...); `draft`: a DraftRequest, or a draft model's path (speculative decoding)."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise MoeplaceError(
            f"moeplace.recommend: no option {unknown[0]!r}; the options are Request's: {sorted(_OPTIONS)}."
        )
    if isinstance(options.get("draft"), str):
        options["draft"] = DraftRequest(options["draft"])
    contexts = (ctx,) if isinstance(ctx, int) else tuple(ctx)
    sizes = (vram,) if isinstance(vram, str) else tuple(vram) if vram is not None else None
    auto = sizes == ("auto",)
    request = Request(contexts=contexts, model=model, vram=None if auto else sizes, auto=auto, **options)
    return recommend_mod.recommend(request)


def optimal(model: str, *, ctx: int, vram: str | None = None, **options: Any) -> list[RankedPlacement]:
    """`recommend --placement optimal` at one context: the placements that fit, ranked by the speed model (empty
    where nothing fits)."""
    plans = recommend(model, ctx=ctx, vram=vram, placement="optimal", **options).plans
    return plans[0].get("placements", []) if plans else []


def predict(
    model: str,
    *,
    n_cpu_moe: Sequence[int] | None = None,
    depth: Sequence[int] = (0,),
    card: str | None = None,
    backend: str | None = None,
    ubatch: int = DEFAULT_UBATCH,
    kv: tuple[str, str] = (DEFAULT_CACHE_TYPE, DEFAULT_CACHE_TYPE),
    speeds: Speeds | None = None,
) -> list[PredictedSpeed]:
    """`moeplace predict` as values: decode and prefill tok/s with ~95% intervals per n (default: every n) and
    depth, from the prior for `card` (or `speeds`' figures, or a calibration in `speeds`)."""
    check_ubatch(ubatch)
    meta = inspect_model(model)
    n_values = sorted(set(n_cpu_moe)) if n_cpu_moe is not None else list(range(meta.n_layer + 1))
    if any(not 0 <= n <= meta.n_layer for n in n_values):
        raise MoeplaceError(f"n_cpu_moe: give values within 0-{meta.n_layer} (this model's layers).")
    model_ = card_speed_model(speeds or Speeds(), meta, card, backend)
    return predicted_speeds(meta, model_, n_values, tuple(depth), ubatch, kv)


def explain(text: str) -> Explanation:
    """`moeplace explain` of a llama.cpp log's text: what went where per device, and why it ran out."""
    return explain_text(text)


def inspect(path: str) -> ModelMeta:
    """A GGUF model's header as bytes by role per layer and its KV shape (any shard of a split model; header only)."""
    return inspect_model(path)
