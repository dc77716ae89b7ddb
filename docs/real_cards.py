"""Write docs/real-cards.md: moeplace's memory model against what real cards printed (tests/data/llamacpp/), the
memory each backend showed beyond llama.cpp's buffers, and published --n-cpu-moe out-of-memory boundaries
(tools/published/), from the facts typed in tests/data/real_cards.yaml.

python docs/real_cards.py          # rewrite docs/real-cards.md
python docs/real_cards.py --check  # exit 1 if it is out of date (a test runs this)
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import yaml
from generated import write_or_check

from moeplace.core.backends import op_offload
from moeplace.core.config import Device
from moeplace.model.gguf_file import read_header
from moeplace.model.kvcache import cells, kv_bytes, pad, row_size
from moeplace.model.memory import Pins, Workload, device_need, state_bytes
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.budget import plan
from moeplace.runtime.llama_log import read_log
from moeplace.runtime.tool_output import list_devices, rocm_smi

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import corpus  # noqa: E402  (tools/corpus.py: the corpus files with their headers)

FACTS = ROOT / "tests/data/real_cards.yaml"
OUT = ROOT / "docs/real-cards.md"
MiB = 2**20
ALIGN = 256  # the most a backend's buffer pads one tensor (its alignment, 32-256 bytes)
BACKENDS = ("cuda", "rocm", "vulkan", "metal", "sycl")
KINDS = ("weights", "kv", "compute")
TWIN_LEVELS = ("exact", "inferred", "shapes")


@dataclass
class Twin:
    meta: dict[str, Any]
    tensors: dict[str, int]  # name -> bytes


class Twins:
    """Header-only twins in a scratch folder, one per (spec, ftype): their metadata and tensor table."""

    def __init__(self, scratch: Path, specs: dict[str, Any]):
        self.scratch, self.specs, self.made = scratch, specs, {}

    def spec_data(self, ref: str) -> dict[str, Any]:
        if ref in self.specs:
            inline = self.specs[ref]
            return {**yaml.safe_load((ROOT / inline["base"]).read_text()), **inline["set"]}
        return yaml.safe_load((ROOT / ref).read_text())

    def get(self, ref: str, ftype: str | None = None) -> Twin:
        data = self.spec_data(ref) | ({"ftype": ftype} if ftype else {})
        key = yaml.safe_dump(data, sort_keys=True)
        if key not in self.made:
            n = len(self.made)
            (self.scratch / f"spec{n}.yaml").write_text(key)
            path = write_twin(load_spec(self.scratch / f"spec{n}.yaml"), self.scratch / f"twin{n}.gguf")
            self.made[key] = Twin(inspect_model(path), {t.name: t.n_bytes for t in read_header(path).tensors})
        return self.made[key]


def workload(fact: dict[str, Any], backend: str) -> Workload:
    """The log's workload; these builds reserve logits for a whole batch (llama-server's one per slot is 2026's),
    and a GPU backend copies host matrices into its compute buffer for a large batch (op offload)."""
    return Workload(
        fact["ctx"],
        fact.get("ubatch", 512),
        fact.get("flash_attn", "auto"),
        fact.get("type_k", "f16"),
        fact.get("type_v", "f16"),
        fact.get("parallel", 1),
        op_offload=op_offload(backend),
    )


# --- table 1: each twinned log against our model ----------------------------------------------------------------


@dataclass
class Row:
    file: str
    fact: dict[str, Any]
    backend: str
    n_devices: int
    log: dict[str, float | None]  # MiB; weights and kv summed over the devices, compute where one device
    log_compute: list[float]  # MiB, per device
    ours: dict[str, float]  # MiB: weights with the log's placement applied, kv, compute (our estimate)
    weights_model: float  # MiB, memory.py's device weights for the placement it models
    host_extra: float  # MiB the placement keeps on the host that memory.py counts on the device
    host_extra_what: str
    expect: dict[str, float] = field(default_factory=dict)  # the explained difference log - ours, MiB
    expect_why: dict[str, str] = field(default_factory=dict)
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # (lo, hi) of diff - expect, MiB
    vram: dict[str, Any] | None = None  # what the card reported, against the buffers

    def diff(self, kind: str) -> float | None:
        log = self.log.get(kind)
        return None if log is None or kind not in self.ours else log - self.ours[kind]

    def compared(self, kind: str) -> bool:
        if (kind == "weights" and self.fact["twin"] == "shapes") or (kind == "compute" and "skip_compute" in self.fact):
            return False
        return self.diff(kind) is not None and (kind != "compute" or self.n_devices == 1)

    @property
    def device_only(self) -> bool:
        """Every matrix the graph multiplies lives on the device: the compute buffer holds no copies of host ones."""
        return not self.fact.get("placement") and "host_weights" not in self.fact

    def within(self, kind: str) -> bool:
        lo, hi = self.bounds[kind]
        return lo <= self.diff(kind) - self.expect.get(kind, 0.0) <= hi


def first_target(name: str, rules: list[list[str]]) -> str | None:
    """The target of the first -ot rule whose regex is found in the tensor name (llama.cpp's regex_search)."""
    return next((target for pattern, target in rules if re.search(pattern, name)), None)


def placed(twin: Twin, fact: dict[str, Any], w: Workload) -> tuple[Any, float, float, str]:
    """memory.py's device need for the log's placement (its -ot rules' experts as host pins, --n-cpu-moe), and
    the bytes the placement keeps on the host beyond that: non-expert tensors the rules send to the CPU, and what
    -ngl at or below the layer count leaves there."""
    meta, p = twin.meta, fact.get("placement", {})
    experts = {name for layer in meta.layers for name in layer.expert_tensors}
    n = p.get("n_cpu_moe", 0)
    ruled = {name for name in twin.tensors if first_target(name, p.get("ot", [])) == "CPU"}
    pins = Pins(host=frozenset((ruled & experts) | (experts if p.get("experts") == "all" else set())))
    need = device_need(meta, w, n, pins=pins)
    pinned = pins.host_set(meta, n)
    host, what = ruled - experts, []
    if host:
        what.append(f"{len(host)} non-expert tensors the -ot rules send to the CPU (routers, norms)")
    ngl = p.get("ngl")
    if ngl is not None and ngl <= meta.n_layer:
        start = meta.n_layer - ngl
        layers = {name for name in twin.tensors if (m := re.match(r"blk\.(\d+)\.", name)) and int(m[1]) < start}
        host |= layers | {"output.weight", "output_norm.weight"}
        what.append(
            f"layers 0-{start - 1} and the output layer (-ngl {ngl})" if start else f"the output layer (-ngl {ngl})"
        )
        if "output.weight" not in twin.tensors:  # tied: the device's copy of the embedding stays off it too
            host.add("token_embd.weight")
    if "output.weight" in twin.tensors:
        host.discard("token_embd.weight")  # memory.py keeps the input embedding on the host already
    extra = sum(twin.tensors[name] for name in host - pinned if name in twin.tensors)
    return need, extra / MiB, need.weights / MiB, "; ".join(what)


def expected_kv(twin: Twin, fact: dict[str, Any], w: Workload, ours_kv: float) -> tuple[float, str]:
    """The KV difference (log - ours, MiB) a build's own cache sizing explains: fewer padded cells, or one
    unified cache for all sequences."""
    meta = twin.meta
    per_seq_state = state_bytes(meta) * w.parallel
    if "kv_cells" in fact:
        assert not any(layer.swa for layer in meta.layers), "kv_cells: full-attention models only"
        per_cell = kv_bytes(meta, w.ctx, w.type_k, w.type_v, w.ubatch) / pad(w.ctx)
        theirs = (per_cell * fact["kv_cells"] + per_seq_state) / MiB
        return theirs - ours_kv, (
            f"the build padded the cache to {fact['kv_cells']} cells, ours to "
            f"{pad(w.ctx) * w.parallel} (256 per sequence)"
        )
    if fact.get("kv_unified"):
        total = 0
        for layer in meta.layers:
            if layer.has_kv:
                window = meta.attention.sliding_window if layer.swa else 0
                n = cells(w.ctx * w.parallel, window, w.ubatch, w.parallel)
                total += n * (row_size(w.type_k, layer.k_dim) + (row_size(w.type_v, layer.v_dim) if layer.v_dim else 0))
        theirs = (total + per_seq_state) / MiB
        return theirs - ours_kv, (
            f"one unified cache for {w.parallel} sequences (kv_unified): its sliding-window "
            f"layers hold window x {w.parallel} + ubatch cells, ours window + ubatch per sequence"
        )
    return 0.0, ""


def log_values(sample: corpus.Sample, fact: dict[str, Any]) -> tuple[dict[str, float | None], list[float], int]:
    devices = read_log(sample.text).buffers.devices
    found: dict[str, float | None] = {}
    for kind in KINDS:
        values = [kinds[kind] / MiB for kinds in devices.values() if kind in kinds]
        found[kind] = sum(values) if values else None
    compute = [kinds["compute"] / MiB for kinds in devices.values() if "compute" in kinds]
    n_devices = max(len(devices), 1)
    for kind, value in fact.get("log", {}).items():
        found[kind] = float(value)
        if kind == "compute":
            compute = [float(value)]
    if found["compute"] is not None and n_devices > 1:
        found["compute"] = None  # per device: not summable
    return found, compute, n_devices


def row_for(name: str, fact: dict[str, Any], sample: corpus.Sample, twins: Twins) -> Row:
    twin = twins.get(fact["spec"], fact.get("quant"))
    w = workload(fact, sample.header["backend"])
    need, extra, weights_model, what = placed(twin, fact, w)
    kv = need.kv / MiB
    if fact.get("kv_state") is False:
        kv -= state_bytes(twin.meta) * w.parallel / MiB
    log, compute, n_devices = log_values(sample, fact)
    row = Row(
        name,
        fact,
        sample.header["backend"],
        n_devices,
        log,
        compute,
        {"weights": weights_model - extra, "kv": kv, "compute": need.compute / MiB},
        weights_model,
        extra,
        what,
    )
    if "weights" in fact.get("expect", {}):
        row.expect["weights"], row.expect_why["weights"] = fact["expect"]["weights"], fact["expect_why"]
    row.expect["kv"], row.expect_why["kv"] = expected_kv(twin, fact, w, kv)
    # The printed values are rounded (2 decimals; the memory breakdown rounds down to whole MiB) and a buffer
    # pads each tensor to its alignment: the log may exceed the sum of tensor bytes by that much, never more.
    whole = "breakdown" in fact.get("log_from", "")
    rounding = (1.0 if whole else 0.005) * n_devices
    on_device = len(twin.tensors) * ALIGN / MiB
    row.bounds["weights"] = (-rounding, rounding + on_device)
    row.bounds["kv"] = (-rounding, rounding + fact.get("kv_tol_mib", 0.0))
    row.vram = vram_reading(fact, row)
    return row


def vram_reading(fact: dict[str, Any], row: Row) -> dict[str, Any] | None:
    """What the card reported in the same text, one device: the free memory at load (our total must fit in it)
    or the memory used while running (beyond the buffers: the runtime's own share)."""
    vram = fact.get("vram")
    if not vram or row.n_devices > 1 or any(row.log[k] is None for k in KINDS) or fact["twin"] == "shapes":
        return None
    logged, ours = sum(row.log[k] for k in KINDS), sum(row.ours[k] for k in KINDS)
    if "free_running" in vram:
        used = vram["total"] - vram["free_running"]
        return {"reported": f"{used} used while running ({vram['total']} total − {vram['free_running']} free)",
                "value": used, "logged": logged, "ours": ours}  # fmt: skip
    (free,) = vram["free_at_load"].values()
    return {"reported": f"{free} free at load", "value": free, "logged": logged, "ours": ours}


# --- table 2: the memory each backend showed beyond llama.cpp's buffers ----------------------------------------


def overhead(r: dict[str, Any]) -> float:
    if r["kind"] == "running":
        return r["total"] - r["free"] - r["buffers"]
    if r["kind"] == "idle":
        return r["used"]
    return r["total"] - r["free"]


def check_reading(r: dict[str, Any], sample: corpus.Sample) -> None:
    """The typed numbers are the text's: list-devices and rocm-smi through moeplace's readers, the rest as printed
    numbers (a nominal total comes from the hardware line, an approximate reading from the post's words)."""
    text = sample.text
    if r["kind"] == "idle":
        assert any(g.get("total_mib") == r["total"] and g.get("used_mib") == r["used"] for g in rocm_smi(text)), r
        return
    listed = {d.name: d for d in list_devices(text)}
    if r["device"] in listed and r["kind"] == "load":
        d = listed[r["device"]]
        assert (d.total_bytes / MiB, d.free_bytes / MiB) == (r["total"], r["free"]), r
        return
    if r.get("approx"):
        return
    numbers = set(re.findall(r"\d+(?:\.\d+)?", text))
    typed = [r["free"]] + ([] if r["kind"] == "nominal" else [r["total"]]) + [r[k] for k in ("buffers",) if k in r]
    missing = [v for v in typed if f"{v:g}" not in numbers and str(v) not in numbers]
    assert not missing, f"{r['file']}: {missing} not printed in the text"


# --- table 3: published --n-cpu-moe out-of-memory boundaries -----------------------------------------------------


def boundary_row(b: dict[str, Any], twins: Twins) -> dict[str, Any]:
    meta = twins.get(b["spec"], b.get("quant")).meta
    w = workload(b, b["backend"])

    def need(n: int) -> float:
        return device_need(meta, w, n).total / MiB

    out = {"need_ran": need(b["ran"]), "need_failed": need(b["failed"])}
    for key in ("vram_nominal", "free_at_load"):
        vram = b.get(key)
        if vram is None:
            continue
        n0 = plan(meta, Device(vram * MiB, 0), w)["n_cpu_moe"]
        out[key] = {"n0": n0, "exclude_failed": vram - out["need_failed"], "keep_ran": vram - out["need_ran"]}
    return out


# --- the document ------------------------------------------------------------------------------------------------


def mib(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def signed(x: float | None) -> str:
    return "—" if x is None else f"{x:+,.2f}"


def placement_text(fact: dict[str, Any]) -> str:
    if "placement_text" in fact:
        return fact["placement_text"]
    p = fact.get("placement", {})
    parts = []
    if p.get("experts") == "all":
        parts.append("all experts on the host")
    if "n_cpu_moe" in p:
        parts.append(f"--n-cpu-moe {p['n_cpu_moe']}")
    if "ngl" in p:
        parts.append(f"-ngl {p['ngl']}")
    parts += [f"-ot `{rx.replace('|', '¦')}={target}`" for rx, target in p.get("ot", [])]
    return ", ".join(parts) or "all on the device"


def settings_text(fact: dict[str, Any]) -> str:
    w = workload(fact, "")
    text = f"{w.ctx}" + (f" x{w.parallel}" if w.parallel > 1 else "")
    text += f", fa {w.flash_attn}"
    if (w.type_k, w.type_v) != ("f16", "f16"):
        text += f", {w.type_k}/{w.type_v}"
    return text + (f", ub {w.ubatch}" if w.ubatch != 512 else "")


def model_text(fact: dict[str, Any], twins: Twins) -> str:
    name = twins.spec_data(fact["spec"])["name"]
    quant = fact.get("quant") or "any"
    return f"{name} {quant} ({fact['twin']})" if fact["twin"] != "shapes" else f"{name} (shapes)"


def cell(row: Row, kind: str) -> str:
    if kind == "compute" and "skip_compute" in row.fact:
        return f"{' / '.join(mib(c) for c in row.log_compute) or '—'} / not compared / —"
    if kind == "compute" and row.n_devices > 1:
        per = " / ".join(mib(c) for c in row.log_compute) or "—"
        return f"{per} (per device) / {mib(row.ours['compute'])} / —"
    if kind == "weights" and row.fact["twin"] == "shapes":
        return f"{mib(row.log['weights'])} / not compared / —"
    mark = "†" if kind == "weights" and row.host_extra else ""
    return f"{mib(row.log[kind])} / {mib(row.ours[kind])}{mark} / {signed(row.diff(kind))}"


def render(
    facts: dict[str, Any], rows: list[Row], skipped: dict[str, str], boundaries: list[tuple], twins: Twins
) -> str:
    lines = [
        "# Real cards: our memory model against what real GPUs printed",
        "",
        "Generated by `docs/real_cards.py` from the corpus of real llama.cpp output (`tests/data/llamacpp/`), the",
        "facts typed in `tests/data/real_cards.yaml` and the published sweeps (`tools/published/`); "
        "`tests/test_real_cards.py` checks it (rerun it after changing memory.py or the recipe). Do not edit by hand.",
        "",
        "Each twin is a header-only GGUF of the spec at the quant (llama.cpp's own quantization recipe, "
        "`recipe.py`); ours is `memory.device_need` for the log's context, cache types, flash attention, ubatch, "
        "sequences and placement. Sizes are MiB; every cell is *log / ours / log − ours*. Weights and KV are "
        "summed over a run's devices; compute is per device (a multi-device run lists its devices' and gives "
        "no difference). Ours for compute is `estimate_compute`, an estimate: llama.cpp's own reserve (a build) is "
        "the exact figure the budget uses when it can.",
        "",
        "## 1. Buffers: the log against our model",
        "",
        "| file | backend | card | model, quant (twin) | ctx, settings | placement | weights | KV | compute |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row.file} | {row.backend} | {row.fact['card']} | {model_text(row.fact, twins)} | "
            f"{settings_text(row.fact)} | {placement_text(row.fact)} | "
            + " | ".join(cell(row, k) for k in KINDS)
            + " |"
        )
    lines += ["", "Notes, row by row (expected differences are the ones the test allows for):", ""]
    for row in rows:
        notes = [f"quant: {row.fact.get('quant_from', '—')}"]
        if row.host_extra:
            notes.append(
                f"† memory.py counts {row.weights_model:,.2f} on the device; the run kept {row.host_extra:,.2f} "
                f"more on the host: {row.host_extra_what} (not modelled by memory.py)"
            )
        for kind in ("weights", "kv"):
            if row.expect.get(kind):
                notes.append(f"{kind}: expected {row.expect[kind]:+.2f}: {row.expect_why[kind]}")
        if row.fact.get("log_from"):
            notes.append(f"log values from {row.fact['log_from']}")
        for key, label in (("skip_compute", "compute not compared"), ("host_weights", "compute"), ("note", "")):
            if key in row.fact:
                notes.append(f"{label}: {row.fact[key]}" if label else row.fact[key])
        lines.append(f"- **{row.file}**: " + "; ".join(notes) + ".")
    lines += ["", summary(rows, skipped), ""]
    lines += render_vram(rows)
    lines += ["", "### Not twinned", ""]
    lines += [f"- {name}: {why}" for name, why in sorted(skipped.items())]
    lines += render_readings(facts["readings"], facts.get("meaning", {}))
    lines += render_boundaries(boundaries, twins)
    return "\n".join(lines) + "\n"


def render_vram(rows: list[Row]) -> list[str]:
    lines = [
        "### Our device total against what the card reported",
        "",
        "Where the same text prints the card's memory: free at load (left = free − the device's buffers) or used "
        "while running (beyond = used − the buffers).",
        "",
        "| file | card | reported (MiB) | log buffers | ours | left / beyond, log | left / beyond, ours |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        v = row.vram
        if v:
            log, ours = v["value"] - v["logged"], v["value"] - v["ours"]
            lines.append(f"| {row.file} | {row.fact['card']} | {v['reported']} | {mib(v['logged'])} | "
                         f"{mib(v['ours'])} | {mib(log)} | {mib(ours)} |")  # fmt: skip
    return lines


def ratio_range(rows: list[Row]) -> str:
    ratios = sorted(r.ours["compute"] / r.log["compute"] for r in rows)
    return f"{ratios[0]:.2f}–{ratios[-1]:.2f} over {len(ratios)} logs" if ratios else "no logs"


def summary(rows: list[Row], skipped: dict[str, str]) -> str:
    counts = {level: sum(1 for r in rows if r.fact["twin"] == level) for level in TWIN_LEVELS}
    weighed = [r for r in rows if r.compared("weights")]
    kv = [r for r in rows if r.compared("kv")]
    compute = [r for r in rows if r.compared("compute")]
    worst = max(abs(r.diff("weights") - r.expect.get("weights", 0)) for r in weighed)
    return (
        f"{len(rows)} logs twinned ({counts['exact']} exact, {counts['inferred']} inferred, {counts['shapes']} "
        f"shapes only); {len(skipped)} not. Weights, with the run's placement applied and the explained "
        f"differences taken off: within {worst:.2f} MiB over {len(weighed)} logs. KV: within "
        f"{max(abs(r.diff('kv') - r.expect.get('kv', 0)) for r in kv):.2f} MiB over {len(kv)} logs. Compute, ours "
        f"/ log on one device: {ratio_range([r for r in compute if r.device_only])} where every matrix is on the "
        f"device; {ratio_range([r for r in compute if not r.device_only])} where some are on the host: a GPU "
        "backend copies a host matrix into the device's compute buffer to multiply it there, which our estimate "
        "counts for the largest expert tensor on the host, not for an output matrix -ngl leaves there."
    )


def render_readings(readings: list[dict[str, Any]], meaning: dict[str, str]) -> list[str]:
    lines = [
        "",
        "## 2. Memory beyond llama.cpp's buffers, per backend",
        "",
        "- **running**: used while llama.cpp runs (total − free) minus the buffers it logged: what a margin over "
        "`--vram auto` (the free memory read before loading) must cover: the runtime's context, workspaces, "
        "the pool for temporary tensors.",
        "- **load**: the card's total minus the free memory read before loading (the driver, context and desktop "
        "share, other programs).",
        "- **nominal**: the card's nominal size (the hardware line; the text prints no total) minus that free "
        "memory: what a margin over `--vram` given as the card's size must cover before the running share.",
        "- **idle**: rocm-smi's used memory with nothing of llama.cpp loaded.",
        "",
        "| backend | kind | file | device, card | total | free / used | buffers | beyond (MiB) | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {b: i for i, b in enumerate(BACKENDS)}
    kinds = ("running", "load", "nominal", "idle")
    for r in sorted(readings, key=lambda r: (order[r["backend"]], kinds.index(r["kind"]))):
        used = r.get("used", r.get("free"))
        approx = "≈" if r.get("approx") else ""
        lines.append(
            f"| {r['backend']} | {r['kind']} | {r['file']} | {r['device']}, {r['card']} | {r['total']:g} | "
            f"{used:g} | {mib(r.get('buffers'))} | {approx}{overhead(r):,.0f} | {r.get('note', '')} |"
        )
    lines += ["", "How many readings each backend has:", ""]
    for backend in BACKENDS:
        mine = [r for r in readings if r["backend"] == backend]
        parts = []
        for kind in kinds:
            values = sorted(overhead(r) for r in mine if r["kind"] == kind)
            if values:
                spread = f"{values[0]:,.0f}" if len(values) == 1 else f"{values[0]:,.0f}–{values[-1]:,.0f}"
                spread += f", median {median(values):,.0f}" if len(values) > 2 else ""
                parts.append(f"{len(values)} {kind} ({spread})")
        lines.append(f"- **{backend}**: " + ("; ".join(parts) or "none") + ". " + meaning.get(backend, ""))
    return lines


def render_boundaries(boundaries: list[tuple[dict[str, Any], dict[str, Any]]], twins: Twins) -> list[str]:
    lines = [
        "",
        "## 3. Published --n-cpu-moe out-of-memory boundaries",
        "",
        "The lowest n that ran and the n tried after it that ran out of memory, against our need at margin 0 "
        "(weights + KV + our compute estimate). For each way of giving the card: our minimum n at margin 0, the "
        "margin above which ours rules out the n that failed (vram − need(failed)), and the margin up to which "
        "ours still allows the n that ran (vram − need(ran)). A margin between the two puts our minimum n at the "
        "published boundary; a negative first figure means margin 0 already rules the failed n out.",
        "",
        "| setup | backend | card | model | ctx, settings | ran / failed | ours: need(ran) / need(failed) | "
        "--vram nominal: n at 0 / exclude > / keep ≤ | --vram auto (free at load): n at 0 / exclude > / keep ≤ |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b, out in boundaries:
        cols = []
        for key in ("vram_nominal", "free_at_load"):
            if key not in out:
                cols.append("— (not given)")
                continue
            o = out[key]
            cols.append(f"{b[key]}: {o['n0']} / {o['exclude_failed']:,.0f} / {o['keep_ran']:,.0f}")
        name = twins.spec_data(b["spec"])["name"]
        lines.append(
            f"| {b['setup']} | {b['backend']} | {b['card']} | {name} {b.get('quant') or ''} | "
            f"{settings_text(b)} | {b['ran']} / {b['failed']} | {out['need_ran']:,.0f} / "
            f"{out['need_failed']:,.0f} | " + " | ".join(cols) + " |"
        )
    lines += ["", "The margins that put our minimum n at every published boundary of a backend at once:", ""]
    for backend in BACKENDS:
        mine = [out for b, out in boundaries if b["backend"] == backend]
        parts = []
        for key, label in (("vram_nominal", "over the nominal size"), ("free_at_load", "over the free memory")):
            windows = [out[key] for out in mine if key in out]
            if windows:
                lo, hi = max(o["exclude_failed"] for o in windows), min(o["keep_ran"] for o in windows)
                span = f"more than {lo:,.0f} and at most {hi:,.0f} MiB" if lo < hi else f"none ({lo:,.0f} > {hi:,.0f})"
                parts.append(f"{label} ({len(windows)} boundar{'y' if len(windows) == 1 else 'ies'}): {span}")
        if parts:
            lines.append(f"- **{backend}**: " + "; ".join(parts) + ".")
    lines += ["", "Sources:", ""]
    lines += [
        f"- {b['setup']} ({b['ran']}/{b['failed']}): {b['source']}; quant: {b['quant_from']}"
        + (f"; free at load: {b['free_from']}" if b.get("free_from") else "")
        for b, _ in boundaries
    ]
    return lines


def build(facts: dict[str, Any] | None = None) -> tuple[str, list[Row], list[tuple], dict[str, Any]]:
    """The document, its rows and boundaries, from the corpus and the typed facts."""
    facts = facts or yaml.safe_load(FACTS.read_text())
    samples = {s.path.name: s for s in corpus.samples()}
    logs = {name for name, s in samples.items() if s.format == "log"}
    typed = set(facts["logs"])
    assert typed == logs, f"real_cards.yaml and the corpus differ: {sorted(typed ^ logs)}"
    for r in facts["readings"]:
        r["backend"] = samples[r["file"]].header["backend"]
        check_reading(r, samples[r["file"]])
    with tempfile.TemporaryDirectory(prefix="real-cards-") as scratch:
        twins = Twins(Path(scratch), facts.get("specs", {}))
        rows, skipped = [], {}
        for name in sorted(facts["logs"]):
            fact = facts["logs"][name]
            if "why" in fact:
                skipped[name] = fact["why"]
                continue
            assert fact["twin"] in TWIN_LEVELS, (name, fact["twin"])
            rows.append(row_for(name, fact, samples[name], twins))
        rows.sort(key=lambda r: (BACKENDS.index(r.backend), TWIN_LEVELS.index(r.fact["twin"]), r.file))
        boundaries = [(b, boundary_row(b, twins)) for b in facts["boundaries"]]
        text = render(facts, rows, skipped, boundaries, twins)
    return text, rows, boundaries, facts


def main() -> int:
    text, *_ = build()
    return write_or_check(OUT, text, "docs/real-cards.md", "real_cards.py")


if __name__ == "__main__":
    sys.exit(main())
