"""Speculative decoding's device memory, as the pinned llama.cpp (b11434) allocates it: a draft model's (-md,
`--spec-type draft-simple`) or the model's own MTP/NextN head's (`--spec-type draft-mtp`) second context, built
after the main one, and what drafting changes in the main one.

llama-server's load_model (tools/server/server-context.cpp) builds the main context, then
common_speculative_init_from_params (common/speculative.cpp) a second one from common_base_params_to_speculative:
the main's parameters with
- the draft model (-md) and its -ngld, or for draft-mtp the main model itself with an MTP context type;
- n_ctx = the main context's (`cparams.n_ctx = llama_n_ctx(ctx_tgt)`: this build has no -cd/--ctx-size-draft), the
  same ubatch, batch, flash attention, slots and -nkvo;
- its own KV cache types, -ctkd/-ctvd (common.h: f16 by default, whatever -ctk/-ctv the main context has);
- n_outputs_max = the slots (one logit row each) and n_rs_seq = 0.
Drafting changes the main context too: a server reserves logits for 1 + n_max tokens per slot (server_output_limits
-> common_speculative_get_output_limits; n_max is --spec-draft-n-max, 3 by default; this build removed --draft-max),
and with draft-mtp an architecture that rolls its recurrent state back (llama-arch.cpp llm_arch_supports_rs_rollback)
keeps n_max snapshots of every recurrent state (common_context_params_to_llama: n_rs_seq = need_n_rs_seq();
llama-memory-recurrent.cpp: mem_size x (1 + n_rs_seq) rows).

The draft model's buffers are a model's (memory.py) at its own workload. The MTP head's weights (the NextN block at
the end of block_count) are loaded only for draft-mtp (common_model_params_to_llama: load_mtp; e.g.
models/qwen35moe.cpp marks them TENSOR_SKIP otherwise), into the main model's buffers on the device of their layer;
the MTP context keeps a plain KV cache of the head's layers alone (llama-model.cpp create_memory: the filter
il >= n_layer()) and its own compute buffer.

A draft must share the main model's vocabulary, as llama.cpp checks it (common_speculative_are_compatible): the same
tokenizer type, BOS and EOS, at most 128 tokens more or fewer, and the same token texts from id 5 on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..core.errors import MoeplaceError
from .gguf_file import GGUFHeader, read_header
from .kvcache import CACHE_TYPES, kv_bytes
from .memory import Workload, device_weight_bytes, estimate_compute
from .meta import Layer, ModelMeta
from .metadata import from_header, nextn_head

SIMPLE = "draft-simple"  # llama.cpp's --spec-type names (common/speculative.cpp common_speculative_type_to_str)
MTP = "draft-mtp"
SPEC_TYPES = (SIMPLE, MTP)
DRAFT_MAX = 3  # common.h common_params_speculative_draft::n_max
# llama-arch.cpp llm_arch_supports_rs_rollback: the recurrent states that keep rollback snapshots for MTP drafting.
ROLLBACK_ARCHS = (
    *("kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next"),
    *("nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"),
)
# common/speculative.cpp SPEC_VOCAB_MAX_SIZE_DIFFERENCE and SPEC_VOCAB_CHECK_START_TOKEN_ID
VOCAB_MAX_DIFFERENCE = 128
VOCAB_CHECK_START = 5


@dataclass(frozen=True)
class DraftRequest:
    """What a request asks of speculative decoding, as recommend's flags give it, checked when made: a draft model
    (-md), llama.cpp's --spec-type, the tokens drafted a step (--draft-max: llama.cpp's --spec-draft-n-max), the draft
    context's KV types (-ctkd/-ctvd) and -cd, which the pinned build no longer has."""

    model: str | None = None
    kind: str | None = None
    n_max: int = DRAFT_MAX
    type_k: str = "f16"
    type_v: str = "f16"
    ctx: int | None = None
    ngl: str = "all"  # -ngld: the draft's layers on the card; planned whole (all, or a count of 99 or more)

    def __post_init__(self) -> None:
        if self.ngl != "all" and not (self.ngl.isdigit() and int(self.ngl) >= 99):
            raise MoeplaceError(
                f"-ngld {self.ngl}: moeplace plans the draft wholly on the card (-ngld all); a draft split with the "
                "host is not planned: give -ngld all, or plan without the draft."
            )
        if self.ctx is not None:
            raise MoeplaceError(
                f"-cd {self.ctx}: the pinned llama.cpp (b11434) has no --ctx-size-draft: its draft context holds the "
                "main's -c (common_speculative_init_result), as planned; drop -cd."
            )
        choices = (("--spec-type", self.kind, SPEC_TYPES), ("-ctkd", self.type_k, CACHE_TYPES))
        for flag, value, allowed in (*choices, ("-ctvd", self.type_v, CACHE_TYPES)):
            if value is not None and value not in allowed:
                raise MoeplaceError(f"{flag} {value}: choose one of {', '.join(allowed)}.")
        if not 1 <= self.n_max <= 64:
            raise MoeplaceError(f"--draft-max {self.n_max}: draft 1 to 64 tokens a step (llama.cpp's default 3).")
        if self.model is not None and not Path(self.model).is_file():
            raise MoeplaceError(f"-md {self.model}: no such file; give the draft model's .gguf.")
        if self.kind == SIMPLE and self.model is None:
            raise MoeplaceError("--spec-type draft-simple drafts with a smaller model: give it with -md DRAFT.gguf.")

    @property
    def asked(self) -> bool:
        return self.model is not None or self.kind is not None

    def read(self, model_path: str | None) -> Speculative | None:
        """The speculation asked for beside `model_path`, read from the files (None: none)."""
        if not self.asked or model_path is None:
            return None
        return read_speculative(self.kind, model_path, self.model, self.n_max, (self.type_k, self.type_v))


NO_DRAFT = DraftRequest()


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding as a llama-server line runs it: a draft model (`draft`) or the main model's MTP head
    (`head`, its NextN layers), n_max tokens drafted per step, and the draft context's own KV cache types."""

    kind: str
    n_max: int = DRAFT_MAX
    type_k: str = "f16"
    type_v: str = "f16"
    draft: ModelMeta | None = None
    head: tuple[Layer, ...] = ()

    def main(self, meta: ModelMeta, w: Workload) -> Workload:
        """The main context's workload while drafting: 1 + n_max logit rows per slot, and with draft-mtp the
        recurrent state's rollback snapshots where the architecture keeps them."""
        snapshots = self.n_max if self.kind == MTP and meta.architecture in ROLLBACK_ARCHS else 0
        return replace(w, n_draft=self.n_max, rs_snapshots=snapshots)

    def workload(self, w: Workload) -> Workload:
        """The draft context's workload: the main's context, batch and slots, its own KV types, one output a slot."""
        return replace(w, type_k=self.type_k, type_v=self.type_v, n_draft=0, rs_snapshots=0)

    def model(self, meta: ModelMeta) -> ModelMeta:
        """What the draft context runs, as a model: the draft, or the main model's head layers alone."""
        if self.draft is not None:
            return self.draft
        return replace(meta, layers=list(self.head), n_layer=len(self.head))

    def llama_args(self, draft_path: str | None) -> list[str]:
        """llama-server's flags for this speculation (the draft model wholly on the device: -ngld all)."""
        args = ["--spec-type", self.kind]
        if self.kind == SIMPLE:
            args = ["-md", draft_path or "", "-ngld", "all", *args]
        if self.n_max != DRAFT_MAX:
            args += ["--spec-draft-n-max", str(self.n_max)]
        if (self.type_k, self.type_v) != ("f16", "f16"):
            args += ["-ctkd", self.type_k, "-ctvd", self.type_v]
        return args


@dataclass(frozen=True)
class DraftNeed:
    """The draft context's bytes on the device, by buffer. For draft-mtp `weights` are the head's, which llama.cpp
    loads into the main model's buffer."""

    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


def draft_need(
    spec: Speculative,
    meta: ModelMeta,
    w: Workload,
    n_cpu_moe: int,
    compute: Callable[[Workload], int] | None = None,
) -> DraftNeed:
    """The draft's device buffers beside a main context of workload `w` (the main's, before Speculative.main) with
    --n-cpu-moe n (which reaches an MTP head's experts only when n passes its layer); `compute(w)`: llama.cpp's own
    reserve of the draft model where known, else the estimate."""
    dw = spec.workload(w)
    model = spec.model(meta)
    kv = 0 if w.no_kv_offload else kv_bytes(model, dw.ctx, dw.type_k, dw.type_v, dw.ubatch) * dw.parallel
    if spec.draft is not None:
        weights = device_weight_bytes(spec.draft, 0)
        host: frozenset[str] = frozenset()
    else:
        host = frozenset(t for layer in spec.head if layer.index < n_cpu_moe for t in layer.expert_tensors)
        on_host = sum(b for layer in spec.head for t, b in layer.expert_tensors.items() if t in host)
        weights = sum(sum(layer.bytes.values()) for layer in spec.head) - on_host
    used = compute(dw) if compute is not None and spec.draft is not None else estimate_compute(model, dw, 0, host)
    return DraftNeed(weights, kv, used)


def read_speculative(
    kind: str | None,
    model_path: str,
    draft_path: str | None,
    n_max: int = DRAFT_MAX,
    kv: tuple[str, str] = ("f16", "f16"),
) -> Speculative | None:
    """The speculation a request asks for (None: none): -md's draft, checked against the model's vocabulary as
    llama.cpp checks it, or the model's own MTP head, which it must have."""
    if kind is None and draft_path is None:
        return None
    kind = kind or SIMPLE
    if kind not in SPEC_TYPES:
        raise MoeplaceError(f"--spec-type {kind}: moeplace plans {' or '.join(SPEC_TYPES)} (llama.cpp's names).")
    main = read_header(model_path)
    if kind == SIMPLE:
        if draft_path is None:
            raise MoeplaceError("--spec-type draft-simple drafts with a smaller model: give it, -md DRAFT.gguf.")
        draft = read_header(draft_path)
        if why := vocab_mismatch(main, draft):
            raise MoeplaceError(
                f"-md {draft_path}: llama.cpp refuses it as a draft for {model_path}: {why}; give a draft of the "
                "same model family (its tokenizer)."
            )
        return Speculative(kind, n_max, *kv, draft=from_header(draft))
    if draft_path is not None:
        raise MoeplaceError(
            f"-md {draft_path} with --spec-type draft-mtp: the MTP head is the model's own; drop -md, or use "
            "--spec-type draft-simple for a draft model."
        )
    head = nextn_head(main)
    if not head:
        raise MoeplaceError(
            f"--spec-type draft-mtp: {model_path} has no MTP/NextN head ({main.architecture}.nextn_predict_layers "
            "is 0); use a GGUF converted with its MTP layers, or a draft model with -md."
        )
    return Speculative(kind, n_max, *kv, head=tuple(head))


def _vocab(h: GGUFHeader) -> dict[str, Any]:
    m = h.metadata
    tokens = m.get("tokenizer.ggml.tokens")
    return {
        "type": m.get("tokenizer.ggml.model"),
        "n": tokens["array_length"] if isinstance(tokens, dict) else len(tokens) if isinstance(tokens, list) else 0,
        "tokens": tokens if isinstance(tokens, list) else None,
        "bos": (m.get("tokenizer.ggml.add_bos_token"), m.get("tokenizer.ggml.bos_token_id")),
        "eos": (m.get("tokenizer.ggml.add_eos_token"), m.get("tokenizer.ggml.eos_token_id")),
    }


def vocab_mismatch(main: GGUFHeader, draft: GGUFHeader) -> str | None:
    """Why llama.cpp would refuse `draft` as a draft for `main` (None: it takes it), from their headers. Token texts
    are compared where the header reader keeps them (vocabularies up to 4096 tokens); larger ones by the rest."""
    a, b = _vocab(main), _vocab(draft)
    if a["type"] != b["type"]:
        return f"its tokenizer is {b['type']!r}, the model's {a['type']!r}"
    if a["bos"] != b["bos"] or a["eos"] != b["eos"]:
        return "its BOS/EOS tokens differ from the model's"
    if abs(a["n"] - b["n"]) > VOCAB_MAX_DIFFERENCE:
        return f"its vocabulary has {b['n']} tokens, the model's {a['n']} ({VOCAB_MAX_DIFFERENCE} apart at most)"
    if a["tokens"] is not None and b["tokens"] is not None:
        n = min(a["n"], b["n"])
        if (i := next((i for i in range(VOCAB_CHECK_START, n) if a["tokens"][i] != b["tokens"][i]), None)) is not None:
            return f"token {i} is {b['tokens'][i]!r} in it, {a['tokens'][i]!r} in the model"
    return None
