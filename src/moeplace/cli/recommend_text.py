"""recommend's answer (plan/recommend.py's Recommendation) as the command line prints it, per --emit: the plan in
words with its llama-server lines, the llama-bench lines, a llama-swap config, an Ollama Modelfile, or JSON."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

from ..core.units import GB
from ..plan.assumed import Assumptions, describe_speed, speed_text
from ..plan.budget import beside_text
from ..plan.offload import host_layers
from ..plan.optimal import RankedPlacement
from ..plan.recommend import Plan, Recommendation


def render(rec: Recommendation) -> str:
    """What recommend prints on stdout for the request's --emit (the errors go to stderr: Recommendation.errors)."""
    if rec.split and not rec.request.as_json:
        return _split_text(rec)
    return RENDERERS["json" if rec.request.as_json else rec.request.emit](rec)


def _bench_lines(rec: Recommendation) -> str:
    return "".join(p["command"] + "\n" for p in rec.fitting)


def _modelfile(rec: Recommendation) -> str:
    return rec.fitting[0]["commands"]["ollama"] if rec.fitting else ""


def describe_assumptions(a: Assumptions) -> str:
    ram = f"{a.ram_bytes / GB:.1f} GB ({a.ram_source})" if a.ram_bytes else a.ram_source
    bandwidths = ""
    if a.bw_vram_gbps:
        bandwidths = f"{a.bw_vram_gbps:g} GB/s and {a.card_tflops:g} TFLOPS card, {a.bw_ddr_gbps:g} GB/s host, "
    return "\n".join(
        [
            "assumed:",
            f"  card: {a.backend} ({a.backend_source}), {a.vram_bytes / GB:.2f} GB ({a.vram_source})",
            *([f"  {a.pool.describe()}"] if a.pool else []),
            f"  margin: {a.margin_bytes / 2**20:.0f} MiB kept free ({a.margin_source})",
            f"  speeds: {bandwidths}{a.speed_source}",
            f"  host RAM: {ram}",
        ]
    )


def _server_text(rec: Recommendation) -> str:
    lines = list(rec.notes)
    if rec.assumptions:
        lines += [f"{rec.name}: {rec.structure}", describe_assumptions(rec.assumptions)]
    if rec.rope_note:
        lines.append(rec.rope_note)
    for p in rec.fitting:
        lines += _plan_lines(rec, p)
    return "".join(line + "\n" for line in lines)


def _plan_lines(rec: Recommendation, p: Plan) -> list[str]:
    """One context's plan as text: the buffers, the n, the server line and the expected speeds."""
    compute = (
        f"compute={p['compute_bytes'] / GB:5.2f} GB ({p['compute_source']})  " if p["compute_bytes"] is not None else ""
    )
    lines = [
        f"ctx={p['ctx']:>6}  KV={p['kv_bytes'] / GB:5.2f} GB  {compute}budget={p['budget_bytes'] / GB:5.2f} GB  "
        f"resident_layers={p['resident_layers']:>2}  --n-cpu-moe {p['n_cpu_moe']}"
    ]
    if rec.assumptions is None:
        return lines
    lines += [
        "  " + p["command"],
        *(f"  {line}" for line in beside_text(p)),
        *(f"  note: {note}" for note in p["notes"]),
        "  expected: " + describe_speed(p["speed"], p["ctx"]),
        f"  host RAM: {p['host_bytes'] / GB:.2f} GB of weights stay there",
    ]
    if p["ram_note"]:
        lines.append("  " + p["ram_note"])
    if "placements" in p:
        lines += _placement_lines(rec, p)
    return lines


def _placement_lines(rec: Recommendation, p: Plan) -> list[str]:
    """The feasible placements and KV cache types at this context, fastest predicted first by --objective, and the
    advice: the line to use."""
    r, ctx, ranked = rec.request, p["ctx"], p["placements"]
    if not ranked or ranked[0]["score"] is None:
        why = "the speed model gives no prefill" if r.ranked_by != "decode" else "nothing fits"
        return [f"  placements by {r.ranked_by}: cannot rank ({why})."]
    lines = [
        f"  placements by {r.ranked_by} at {ctx} tokens, fastest predicted first; '~' marks those the speed model "
        "cannot tell from the fastest (the ~90% band of a ratio of two placements of one machine):"
    ]
    for row in ranked:
        lines.append(
            f"  {'~' if row['equivalent'] else ' '} {_what(row)}, KV {row['type_k']}/{row['type_v']}, "
            f"-ub {row['ubatch']}: decode {speed_text(row['tg'])}, prefill {speed_text(row['pp'])}"
        )
    return lines + (_advice_lines(rec, p) if "advice" in p else ["  " + ranked[0]["command"]])


def _what(row: RankedPlacement) -> str:
    tensors, layers = len(row["host_tensors"]), len(host_layers(row["host_tensors"]))
    return {
        "ncmoe": f"--n-cpu-moe {row['n_cpu_moe']}",
        "ngl": f"-ngl {row.get('n_gpu_layers')} (whole layers on the host: decode only)",
        "optimal": f"-ot {shlex.quote(row['override_tensor'] or '')} ({tensors} expert tensors on the host, in "
        f"{layers} layers)",
    }[row["placement"]]


def _pct(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.0f}%"


def _advice_lines(rec: Recommendation, p: Plan) -> list[str]:
    """The line to use, with its gain over the user's own, the gain's ~90% band and what it costs beyond speed, and
    the user's own as the alternative; or the user's own, with how many placements are predicted faster by less
    than the band can tell and the tune line that measures them."""
    r, ranked, advice = rec.request, p["placements"], p["advice"]
    use, yours, what = ranked[advice["use"]], ranked[advice["yours"]], r.ranked_by
    if advice["gain"]:
        g = advice["gain"]
        return [
            f"  use: {use['command']}",
            f"    {_pct(g['ratio'])} {what} over yours ({_pct(g['low'])}..{_pct(g['high'])}: the speed model's ~90% "
            "band on a ratio of two placements of one machine).",
            *(f"    {cost}" for cost in advice["costs"]),
            f"  or yours: {yours['command']}",
        ]
    faster = [i for i in advice["contenders"] if (ranked[i]["score"] or 0) > (yours["score"] or 0)]
    best = advice["fastest"]
    if not faster or not best:
        return ["  yours is predicted fastest:", f"  {yours['command']}"]
    size = r.vram[0] if r.vram and len(r.vram) == 1 else f"{rec.vram_bytes / 2**30:.2f}GiB"
    model = shlex.quote(r.model_ref or r.model or "")
    tune = f"moeplace tune {model} --ctx {p['ctx']} --vram {size} --placement optimal"
    tune += f" --objective {what}" if what != "decode" else ""
    return [
        f"  yours: {len(faster)} placement(s) are predicted faster by {what}, the first above by "
        f"{_pct(best['ratio'])} ({_pct(best['low'])}..{_pct(best['high'])}: the speed model's ~90% band on a ratio "
        f"of two placements of one machine), all by less than it can tell; {tune} measures them on this machine.",
        f"  {yours['command']}",
    ]


def _split_text(rec: Recommendation) -> str:
    """Over several devices: per context each device's share, the expected speeds and the line (--emit bench: the
    lines alone)."""
    server = rec.request.emit == "server"
    lines = list(rec.notes) if server else []
    for s in rec.split:
        if s.error:
            continue
        if server:
            lines.append(
                f"context {s.plan['ctx']} on {len(s.plan['devices'])} devices (llama.cpp's layer split, -ts as layer "
                f"counts; sizes: {rec.sizes_source}):"
            )
            lines += ["  " + text for text in s.shares]
            lines.append(f"  expected: {s.speed_text}; each step from one card to the next priced as a host hop")
        lines.append(("  " if server else "") + s.plan["command"])
    return "".join(line + "\n" for line in lines)


# Each --emit format's text (plan/emit_formats.py lists them; json is the plan itself, above).
RENDERERS: dict[str, Callable[[Recommendation], str]] = {
    "server": _server_text,
    "bench": _bench_lines,
    "llama-swap": lambda rec: rec.llama_swap() or "",
    "ollama": _modelfile,
    "json": lambda rec: json.dumps(rec.as_json(), indent=1) + "\n",
}
