"""Expert-routing traces from llama.cpp's own graph: which experts each token is sent to, layer by layer.

The trace comes from our small tool native/routing.cpp, compiled against the pinned llama.cpp
build (build_tool): it evaluates a prompt (every token's routing, the last layer included) and
then generates tokens greedily, one per decode, copying each layer's `ffn_moe_topk` expert ids
out of the graph. routing_table() condenses a trace into the numbers that matter for expert
placement (how concentrated each layer's traffic is, and how much consecutive tokens share
experts), each beside what uniform-random routing would give.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import MoeplaceError
from ..model.reads import routed_share
from ..runtime.build import Build
from ..runtime.native import build_tool
from ..runtime.outputs import atomic_path
from ..runtime.process import run

TOOL = "routing"
FORMAT = "moeplace-routing 1"
DISTANCES = (1, 8)
COVERAGE = Fraction(4, 5)  # experts_80pct: the fewest experts carrying this share of a layer's activations
PARTS = ("all", "prompt", "generated")
TABLE_COLUMNS = [
    "layer",
    "experts_80pct",
    "experts_80pct_uniform",
    "distinct_experts",
    "distinct_uniform",
    *(f"overlap_d{d}" for d in DISTANCES),
    "overlap_shuffled",
    "overlap_uniform",
    "n_expert",
    "n_expert_used",
    "tokens",
]


@dataclass(frozen=True)
class RoutingTrace:
    """ids[t, i, j]: the j-th expert (in llama.cpp's selection order) of token t at MoE layer layers[i].

    Rows 0 .. n_token_prompt-1 are the prompt, the rest generated tokens (one decode each).
    """

    ids: np.ndarray  # int32 [n_tokens, n_moe_layers, n_expert_used]
    layers: list[int]
    n_expert: int
    n_token_prompt: int

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_expert_used(self) -> int:
        return int(self.ids.shape[2])

    def part(self, part: str) -> RoutingTrace:
        """The prompt rows, the generated rows, or all of them."""
        if part not in PARTS:
            raise MoeplaceError(f"unknown trace part {part!r}; use one of {', '.join(PARTS)}.")
        rows = {
            "all": slice(None),
            "prompt": slice(0, self.n_token_prompt),
            "generated": slice(self.n_token_prompt, None),
        }
        ids = self.ids[rows[part]]
        return RoutingTrace(ids, list(self.layers), self.n_expert, self.n_token_prompt if part != "generated" else 0)


def _check(trace: RoutingTrace, source: str) -> RoutingTrace:
    ids = trace.ids
    if ids.ndim != 3 or ids.shape[1] != len(trace.layers) or ids.shape[2] < 1:
        raise MoeplaceError(f"{source}: routing ids of shape {ids.shape} do not match {len(trace.layers)} layers.")
    if not 0 <= trace.n_token_prompt <= ids.shape[0]:
        raise MoeplaceError(f"{source}: {trace.n_token_prompt} prompt tokens but only {ids.shape[0]} rows.")
    if ids.size and (ids.min() < 0 or ids.max() >= trace.n_expert):
        raise MoeplaceError(f"{source}: expert ids outside [0, {trace.n_expert}).")
    return trace


def parse_trace(text: str, source: str = "routing trace") -> RoutingTrace:
    """Read the tool's output: a format line, `n_layer n_expert k n_prompt n_tokens`, then `token layer id...` rows."""
    lines = text.split("\n", 2)
    if len(lines) < 2 or lines[0].strip() != FORMAT:
        raise MoeplaceError(f"{source} does not start with '{FORMAT}': not an output of moeplace-routing.")
    try:
        n_layer, n_expert, k, n_prompt, n_tokens = (int(x) for x in lines[1].split())
        body = np.array((lines[2] if len(lines) > 2 else "").split(), dtype=np.int64)
    except ValueError:
        raise MoeplaceError(f"{source}: malformed header or rows.") from None
    if body.size % (2 + k):
        raise MoeplaceError(f"{source}: {body.size} numbers do not make rows of {2 + k}.")
    rows = body.reshape(-1, 2 + k)
    layers = sorted({int(x) for x in rows[:, 1]}) if len(rows) else []
    if len(rows) != n_tokens * len(layers):
        raise MoeplaceError(f"{source}: {len(rows)} rows, expected {n_tokens} tokens x {len(layers)} layers.")
    expected_tok = np.repeat(np.arange(n_tokens), len(layers))
    expected_layer = np.tile(np.array(layers, dtype=np.int64), n_tokens)
    if not (np.array_equal(rows[:, 0], expected_tok) and np.array_equal(rows[:, 1], expected_layer)):
        raise MoeplaceError(f"{source}: rows are not one per (token, layer) in token order.")
    if any(not 0 <= layer < n_layer for layer in layers):
        raise MoeplaceError(f"{source}: layer indices outside [0, {n_layer}).")
    ids = rows[:, 2:].reshape(n_tokens, len(layers), k).astype(np.int32)
    return _check(RoutingTrace(ids, layers, n_expert, n_prompt), source)


@dataclass(frozen=True)
class TraceRequest:
    """What to route: `prompt_text`, then `n_gen` greedily generated tokens. n_ctx 0: just large enough.
    verify: the tool also checks every selection against the router scores it was taken from (slower; a
    self-test of how the ids are read out of the graph)."""

    prompt_text: str
    n_gen: int
    n_ctx: int = 0
    verify: bool = False


def trace_routing(
    manifest: Build,
    model_path: str | Path,
    request: TraceRequest,
    threads: int,
    log_file: Path,
    timeout_s: float,
) -> RoutingTrace:
    """Route the request's prompt and generated tokens through the model (CPU only)."""
    log_file = Path(log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    tool = build_tool(TOOL, manifest, log_file)
    if not request.prompt_text:
        raise MoeplaceError("the routing prompt is empty.")
    with tempfile.TemporaryDirectory(prefix="moeplace-routing-") as scratch:
        prompt_file, out_file = Path(scratch) / "prompt.txt", Path(scratch) / "trace.txt"
        prompt_file.write_bytes(request.prompt_text.encode())
        cmd = _tool_command(tool, model_path, request, threads, (prompt_file, out_file))
        result = run(cmd, timeout_s=timeout_s, log_path=log_file, stream_to_log=True)
        if result.timed_out:
            raise MoeplaceError(f"tracing expert routing of {model_path} took over {timeout_s:g} s; see {log_file}.")
        if result.returncode != 0:
            reason = _tool_error(log_file, result.returncode)
            raise MoeplaceError(f"tracing expert routing of {model_path} failed: {reason}; log: {log_file}.")
        return parse_trace(out_file.read_text(), f"routing trace of {model_path}")


def _tool_command(
    tool: Path, model_path: str | Path, request: TraceRequest, threads: int, files: tuple[Path, Path]
) -> list[str]:
    """The routing tool's command line: the model, the (prompt, trace) `files`, and the request."""
    prompt_file, out_file = files
    return [
        str(tool),
        "-m",
        str(model_path),
        "-f",
        str(prompt_file),
        "-n",
        str(int(request.n_gen)),
        "-t",
        str(int(threads)),
        "-c",
        str(int(request.n_ctx)),
        "-o",
        str(out_file),
        *(["--verify"] if request.verify else []),
    ]


def _tool_error(log_file: Path, rc: int | None) -> str:
    """Why the routing tool failed: its last 'error:' line in the log, else its exit status."""
    lines = log_file.read_text(errors="replace").splitlines()
    reason = next((ln for ln in reversed(lines) if "moeplace-routing: error:" in ln), None)
    return reason.split("error:", 1)[1].strip() if reason else f"exit {rc}, see {log_file}"


def save_trace(trace: RoutingTrace, path: str | Path) -> None:
    """Write a trace to an .npz file (whole or not at all)."""
    with atomic_path(path) as tmp, tmp.open("wb") as f:  # a file object: np.savez would add .npz to a name
        np.savez_compressed(
            f,
            ids=trace.ids.astype(np.int32),
            layers=np.asarray(trace.layers, dtype=np.int32),
            n_expert=np.int32(trace.n_expert),
            n_token_prompt=np.int32(trace.n_token_prompt),
        )


def _fewest_covering(counts: np.ndarray, share: Fraction) -> int:
    """Fewest experts whose activations add up to `share` of the total (exact integers: no rounding surprises)."""
    total = int(counts.sum())
    if total == 0:
        return 0
    cum = np.cumsum(np.sort(counts)[::-1].astype(np.int64))
    return int(np.searchsorted(cum * share.denominator, total * share.numerator, side="left")) + 1


def _overlap(onehot: np.ndarray, d: int, k: int) -> float:
    """Mean |S_t ∩ S_{t+d}| / k over the tokens t that have a token d later."""
    if onehot.shape[0] <= d:
        return float("nan")
    return float((onehot[:-d] & onehot[d:]).sum(axis=1).mean() / k)


def routing_table(trace: RoutingTrace, part: str = "all") -> pd.DataFrame:
    """One row per routed layer: concentration and token-to-token reuse of experts, beside uniform-random routing."""
    t = trace.part(part)
    n_expert, k, n_tok = t.n_expert, t.n_expert_used, t.n_tokens
    rows = []
    for i, layer in enumerate(t.layers):
        ids = t.ids[:, i, :]
        counts = np.bincount(ids.ravel(), minlength=n_expert)
        onehot = np.zeros((n_tok, n_expert), dtype=bool)
        onehot[np.arange(n_tok)[:, None], ids] = True
        row = {
            "layer": layer,
            "experts_80pct": _fewest_covering(counts, COVERAGE),
            "experts_80pct_uniform": -(-COVERAGE.numerator * n_expert // COVERAGE.denominator),  # ceil(0.8 E)
            "distinct_experts": int((counts > 0).sum()),
            "distinct_uniform": n_expert * routed_share(k, n_expert, n_tok),
        }
        for d in DISTANCES:
            row[f"overlap_d{d}"] = _overlap(onehot, d, k)
        # The same tokens in random order (any two distinct tokens): what the layer's skew alone gives, no locality.
        pairs = n_tok * (n_tok - 1)
        row["overlap_shuffled"] = float((counts * (counts - 1)).sum() / (pairs * k)) if pairs else float("nan")
        row["overlap_uniform"] = k / n_expert
        rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS[:-3]).assign(n_expert=n_expert, n_expert_used=k, tokens=n_tok)
