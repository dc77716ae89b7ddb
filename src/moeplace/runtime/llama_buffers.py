"""The buffers a llama.cpp log shows, as one run holds them: each load's weights and the contexts created on it, and
what each is for (the main model, a draft model, a model's own MTP head, a multimodal projector), so that what
was alive at once is counted once. Read by llama_log.py, which reads the rest of a log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.errors import MoeplaceError
from .llama_names import MiB, is_host

KINDS = ("weights", "kv", "compute", "output", "input")

# "load_tensors: CUDA0 model buffer size = 30.62 MiB", older "llm_load_tensors: CUDA0 buffer size = ...",
# "llama_kv_cache: CUDA0 KV buffer size = ...", "CUDA_Host compute buffer size", "CPU  output buffer size",
# RS (a recurrent model's state), DSV4 state buffers (DeepSeek-V4's compressor): all what a load or context holds.
# Some locales print a decimal comma ("4095,05 MiB"); builds of 2024 log a host "input buffer".
_BUFFER = re.compile(
    r"(?P<name>[A-Za-z][\w\-]*(?:\[[^\]\s]*\])?)\s+(?P<kind>model |KV |RS |compute |output |input |DSV4 \S+ state )?"
    r"buffer size\s*=\s*(?P<mib>\d+(?:[.,]\d+)?) MiB"
)
_KIND = {
    "model": "weights",
    "": "weights",
    "KV": "kv",
    "RS": "kv",
    "compute": "compute",
    "output": "output",
    "input": "input",
}
# Each context logs its n_ctx first: "llama_context: n_ctx = 4096" (older: llama_new_context_with_model,
# llama_init_from_model).
_CONTEXT = re.compile(r"(?:llama_context|llama_new_context_with_model|llama_init_from_model):\s+n_ctx\s+=\s+(\d+)")
# What the next load or context is for. llama-server loads a draft model (-md) after the main model and its context
# ("srv    load_model: loading draft model '...'"); a model's own MTP head (--spec-type mtp, draft-mtp) gets a second,
# small context on the main model ("creating MTP draft context against the target model"; the MTP pull request's
# branch re-loaded the head from the same GGUF: "partial load — used 18 of 866 tensors"). A multimodal projector
# (--mmproj) logs its own weights and compute buffer (tools/mtmd/clip.cpp: "CLIP using CUDA0 backend", "load_hparams:
# model size: ... MiB", "alloc_compute_meta: CUDA0 compute buffer size = ... MiB").
_DRAFT_LOAD = re.compile(r"loading draft model|load_model: loading draft|draft model '")
_MTP_CONTEXT = re.compile(r"\bMTP\b.*\bcontext\b")
_MTP_LOAD = re.compile(r"partial load\b")
# A run with an MTP head, by what the server says of it (a model's file name, "...-MTP-GGUF", says nothing of the run).
_MTP_ANYWHERE = re.compile(
    r"MTP draft head|MTP (?:draft )?context|spec-type (?:draft-)?mtp|implementation '(?:draft-)?mtp'"
)
_CLIP_DEVICE = re.compile(r"CLIP using (\S+) backend")
_CLIP_WEIGHTS = re.compile(r"(?:load_hparams|clip\w*):\s+model size:\s+(\d+(?:[.,]\d+)?) MiB")
_CLIP_BUFFER = re.compile(r"alloc_compute_meta|\bclip_")
# The parts of a run that are alive together, in the order explain shows them.
ROLES = ("main", "draft", "mtp", "projector")


@dataclass
class Buffers:
    """What one load and one of its contexts hold: bytes per buffer, as llama.cpp names it, and kind
    (weights, kv, compute, output)."""

    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    n_ctx: int | None = None  # the context's size in tokens, where the log says
    role: str = "main"  # main, draft (a -md model's), mtp (a model's own MTP head), projector (--mmproj)

    def add(self, buffer: str, kind: str, size: int) -> None:
        kinds = self.sizes.setdefault(buffer, {})
        kinds[kind] = kinds.get(kind, 0) + size

    @property
    def devices(self) -> dict[str, dict[str, int]]:
        """Per device: its bytes per kind; several devices are never summed into one."""
        return {name: kinds for name, kinds in self.sizes.items() if not is_host(name)}

    @property
    def host(self) -> dict[str, int]:
        """Host RAM per kind, over every host buffer (CPU_Mapped weights, CUDA_Host compute, CPU output ...)."""
        total: dict[str, int] = {}
        for name, kinds in self.sizes.items():
            if is_host(name):
                for kind, size in kinds.items():
                    total[kind] = total.get(kind, 0) + size
        return total

    def device(self, name: str) -> dict[str, int]:
        """One device's bytes per kind ({} where it holds none), by llama.cpp's name for it (CUDA1) or, for an RPC
        device, by its endpoint (RPC0[127.0.0.1:50052]: every RPC server is its own device 0)."""
        for device, kinds in self.devices.items():
            if name in (device, device.rpartition("[")[2].rstrip("]")):
                return kinds
        return {}

    def only_device(self) -> dict[str, int]:
        """The one device's bytes per kind ({} where everything is on the host); a plan for one device must not
        read several as one."""
        devices = self.devices
        if len(devices) > 1:
            raise MoeplaceError(
                f"llama.cpp used {len(devices)} devices ({', '.join(devices)}), but this step plans for one; "
                "make one visible (e.g. CUDA_VISIBLE_DEVICES=0) or see the multi-device plan."
            )
        return next(iter(devices.values()), {})


def merged(*parts: Buffers, role: str = "main") -> Buffers:
    """The buffers of several parts as one (the first part's n_ctx)."""
    out = Buffers(n_ctx=next((p.n_ctx for p in parts if p.n_ctx), None), role=role)
    for part in parts:
        for name, kinds in part.sizes.items():
            for kind, size in kinds.items():
                out.add(name, kind, size)
    return out


@dataclass
class Load:
    """One model load: its weights and the contexts created on it (llama-bench creates one per test), and what it
    is for: the main model, a draft model (-md), or an MTP head re-loaded from the main model's file."""

    weights: Buffers = field(default_factory=Buffers)
    contexts: list[Buffers] = field(default_factory=list)
    role: str = "main"
    projector: Buffers = field(default_factory=lambda: Buffers(role="projector"))

    def last(self, role: str = "main") -> Buffers:
        """The weights with the last context's KV, compute and output buffers (the weights alone before any)."""
        mine = [c for c in self.contexts if c.role == role] or self.contexts
        context = mine[-1] if mine else Buffers()
        return merged(self.weights, context, role=self.role)

    def each_context(self) -> list[Buffers]:
        return [merged(self.weights, context) for context in self.contexts]


def _is_repeat(load: Load, main: Load) -> bool:
    """An MTP head re-loaded from the main model's own file maps the same weights again: the same buffers."""
    return load.role == "mtp" and load.weights.sizes == main.weights.sizes


def live_parts(loads: list[Load], log: str = "") -> list[Buffers]:
    """What a run holds at once: the main model with its context, a draft model with its context, an MTP head's
    context and a projector, each once. A context printed again (an MTP head re-loaded from the same file, a paste
    that repeats a block) is counted once; llama-bench's contexts, one per test, follow each other, so only the
    last is held."""
    if not loads:
        return []
    main_at = max((i for i, load in enumerate(loads) if load.role == "main"), default=len(loads) - 1)
    main = loads[main_at]
    contexts = [c for load in loads[main_at:] if load.role != "draft" for c in load.contexts]
    if _MTP_ANYWHERE.search(log) and not any(c.role == "mtp" for c in contexts) and len(main.contexts) > 1:
        main.contexts[-1].role = "mtp"  # the MTP pull request's branch names the head after its context
    parts = [main.last("main")]
    for load in loads[main_at + 1 :]:
        if load.role == "draft":
            parts.append(merged(load.weights, *load.contexts[-1:], role="draft"))
        elif not _is_repeat(load, main) and load.weights.sizes:
            parts.append(merged(load.weights, role="mtp"))
    mtp = [c for c in contexts if c.role == "mtp" and c.sizes != parts[0].sizes]
    if mtp:
        parts.append(merged(mtp[-1], role="mtp"))
    projector = [load.projector for load in loads[main_at:] if load.projector.sizes]
    if projector:
        parts.append(projector[-1])
    return _join_roles(parts)


def _join_roles(parts: list[Buffers]) -> list[Buffers]:
    """One part per role, in ROLES' order (an MTP head's own weights and its context are one part)."""
    out = []
    for role in ROLES:
        mine = [p for p in parts if p.role == role]
        if mine:
            out.append(merged(*mine, role=role))
    return out


def read_loads(log: str) -> list[Load]:
    """Every load in a llama.cpp log, with its contexts' buffers and what each is for, in order."""
    loads: list[Load] = []
    previous_kind = None
    next_load, next_context = "main", "main"
    clip_device = None
    for line in log.splitlines():
        if _DRAFT_LOAD.search(line):
            next_load = "draft"
        elif _MTP_LOAD.search(line):
            next_load = "mtp"
        elif _MTP_CONTEXT.search(line):
            next_context = "mtp"
        if m := _CLIP_DEVICE.search(line):
            clip_device = m[1]
        if (m := _CLIP_WEIGHTS.search(line)) and loads:
            name = clip_device if clip_device and clip_device != "CPU" else "CPU"
            loads[-1].projector.add(name, "weights", round(float(m[1].replace(",", ".")) * MiB))
            continue
        if m := _CONTEXT.search(line):
            if not loads:
                loads.append(Load())
            role = loads[-1].role if loads[-1].role != "main" else next_context
            loads[-1].contexts.append(Buffers(n_ctx=int(m[1]), role=role))
            next_context = "main"
            previous_kind = "context"
            continue
        m = _BUFFER.search(line)
        if not m:
            continue
        kind = _KIND.get(m["kind"].split()[0] if m["kind"] else "", "kv")
        size = round(float(m["mib"].replace(",", ".")) * MiB)
        name = m["name"]
        if name.endswith("_Mapped") and not is_host(name):  # Metal's mapped weights: the card reads them
            name = name.removesuffix("_Mapped")
        if _CLIP_BUFFER.search(line) and loads:  # the projector's compute buffer
            loads[-1].projector.add(name, kind, size)
            continue
        if kind == "weights":
            if previous_kind != "weights" or not loads:
                loads.append(Load(role=next_load))
                next_load = "main"
            loads[-1].weights.add(name, kind, size)
        else:
            if not loads:
                loads.append(Load())
            load = loads[-1]
            # A log without its n_ctx lines (a pasted excerpt): a context starts at its first buffer, or where a
            # second output buffer shows a new one.
            if not load.contexts or previous_kind == "weights" or (kind == "output" and _has(load.contexts[-1], kind)):
                if previous_kind != "context":
                    load.contexts.append(Buffers(role=load.role if load.role != "main" else next_context))
                    next_context = "main"
            load.contexts[-1].add(name, kind, size)
        previous_kind = kind
    return loads


def _has(buffers: Buffers, kind: str) -> bool:
    return any(kind in kinds for kinds in buffers.sizes.values())


def parse_buffers(log: str) -> list[Buffers]:
    """One Buffers per context a llama.cpp log created, with the weights of the load before it (llama-bench
    creates a context per test; llama-fit-params logs its reserve without allocation the same way)."""
    return [buffers for load in read_loads(log) for buffers in load.each_context()]
