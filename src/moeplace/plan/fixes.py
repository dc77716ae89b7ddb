"""What would make a request fit that does not: each fix a change of the request a user can make, checked to fit by
the same budget as the plan, cheapest first in what it gives up. A fix is only offered when it changes the request
(a q8_0 cache is not offered to a q8_0 request), so the advice never goes in circles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..model.draft import NO_DRAFT
from ..model.kvcache import KV_PAD
from .request import Request
from .unified import GiB, Pool, smallest_pool

# Plan a request: its --n-cpu-moe at `ctx`, None where nothing fits.
Fitted = Callable[[Request, int], "int | None"]

_KV_STEPS = ("f16", "q8_0", "q4_0")  # each half the bytes of the one before, and a little more quality lost


def _smaller_kv(r: Request) -> tuple[Request, str] | None:
    """The next smaller KV cache type than the request's larger one (flash attention on: llama.cpp needs it)."""
    widest = max(_KV_STEPS.index(t) if t in _KV_STEPS else 0 for t in (r.type_k, r.type_v))
    if widest + 1 >= len(_KV_STEPS):
        return None
    kv = _KV_STEPS[widest + 1]
    flags = f"-ctk {kv} -ctv {kv}" + ("" if r.flash_attn == "on" else " -fa on")
    cost = "half the KV bytes, a small quality cost" if kv == "q8_0" else "a quarter of f16's bytes, some quality lost"
    return r.with_(type_k=kv, type_v=kv, flash_attn="on"), f"a {kv} KV cache ({flags}): {cost}"


def _candidates(r: Request) -> list[list[tuple[Request, str]]]:
    """Each kind of fix as a list of changes, least given up first."""
    kinds = []
    if r.flash_attn == "off":
        kinds.append(
            [(r.with_(flash_attn="on"), "flash attention (-fa on): no score matrix, a smaller mask; same output")]
        )
    if smaller := _smaller_kv(r):
        kinds.append([smaller])
    kinds.append(
        [
            (r.with_(parallel=p), f"fewer server slots (--parallel {p}): each slot holds the whole context")
            for p in range(r.parallel - 1, 0, -1)
        ]
    )
    cost = "a smaller compute buffer, slower prefill"
    ubatches = sorted({max(64, r.ubatch // 2), max(64, r.ubatch // 4)} - {r.ubatch}, reverse=True)
    kinds.append([(r.with_(ubatch=u), f"a smaller ubatch (-ub {u}): {cost}") for u in ubatches if u < r.ubatch])
    if r.draft.asked:
        kinds += _draft_fixes(r)
    if not r.no_kv_offload:
        kinds.append(
            [
                (
                    r.with_(no_kv_offload=True),
                    "the KV cache in host RAM (-nkvo): decode reads it over the bus, much slower at long contexts",
                )
            ]
        )
    return kinds


def _draft_fixes(r: Request) -> list[list[tuple[Request, str]]]:
    """With speculative decoding: the draft's KV cache in q8_0 (its own -ctkd/-ctvd), then no draft at all."""
    kinds = []
    if "f16" in (r.draft.type_k, r.draft.type_v):
        flags = "-ctkd q8_0 -ctvd q8_0" + ("" if r.flash_attn == "on" else " -fa on")
        changed = r.with_(draft=replace(r.draft, type_k="q8_0", type_v="q8_0"), flash_attn="on")
        kinds.append([(changed, f"the draft's KV cache in q8_0 ({flags}): half its bytes")])
    undrafted = r.with_(draft=NO_DRAFT)
    kinds.append([(undrafted, "no speculative decoding (drop -md/--spec-type): its buffers freed, decode slower")])
    return kinds


@dataclass(frozen=True)
class Fix:
    """A change of the request that fits: the request as changed, the context it plans, the n it allows."""

    request: Request
    ctx: int
    n_cpu_moe: int
    text: str

    def __str__(self) -> str:
        return f"{self.text}; fits with --n-cpu-moe {self.n_cpu_moe}"


def fixes(request: Request, ctx: int, fitted: Fitted) -> list[Fix]:
    """The changes that make `ctx` fit, with the n each allows: of each kind the first that fits (fewer slots: the
    most that fit; ubatch: the largest), then the longest context that fits as asked."""
    out = []
    for kind in _candidates(request):
        for changed, what in kind:
            if (n := fitted(changed, ctx)) is not None:
                out.append(Fix(changed, ctx, n, what))
                break
    if (longest := longest_context(request, ctx, fitted)) is not None and (n := fitted(request, longest)) is not None:
        per_slot = f" ({longest} per slot)" if request.parallel > 1 else ""
        out.append(Fix(request, longest, n, f"a shorter context: -c {longest * request.parallel}{per_slot}"))
    return out


def longest_context(request: Request, limit: int, fitted: Fitted) -> int | None:
    """The longest context, in whole 256-token steps up to `limit`, at which the request fits (None: none)."""
    lo, hi = 0, limit // KV_PAD
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fitted(request, mid * KV_PAD) is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo * KV_PAD if lo else None


def larger_machine(fits: Callable[[Pool], bool], backend: str) -> list[str]:
    """On unified memory, the smallest machine whose pool (at its default GPU cap) `fits` the request as asked (as a
    fix's words; none where no machine sold does)."""
    if (pool := smallest_pool(fits, backend)) is None:
        return []
    what = "a Mac" if backend == "metal" else "a machine"
    return [f"{what} with {pool.ram_bytes // GiB} GB of unified memory (a GPU cap of {pool.cap_bytes / GiB:.0f} GiB)"]
