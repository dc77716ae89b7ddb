"""What a model is, as every later stage reads it (`Model`): a `ModelMeta` (a GGUF's header: bytes by role per
layer, the attention/KV shape) or a `SeedModel` (the seed's constants: total bytes spread evenly over the layers, one
KV figure per token). The pipeline stores one as results/metadata/{model}.json (`to_json`; docs/method.md lists its
keys) and reads it back with `read_metadata`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Self, TypeAlias, TypedDict

from ..core.errors import MoeplaceError
from ..core.records import FileRecord, JsonObject

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13

ROLES = ("attention", "norm", "router", "shared_expert", "dense_ffn", "expert", "other")
GLOBALS = ("token_embd", "output", "output_norm", "other")


@dataclass(frozen=True)
class Layer:
    """One block: its bytes by role (ROLES), its routed-expert tensors by name, and what it keeps per token: K and
    V rows (has_kv; swa: a sliding window's) or a recurrent state of fixed size."""

    index: int
    expert_bytes: float  # the seed's layers share the expert bytes evenly: not always whole
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))
    expert_tensors: dict[str, int] = field(default_factory=dict)
    has_kv: bool = False
    swa: bool = False
    k_dim: int = 0
    v_dim: int = 0
    state_bytes: int = 0


class LayerKV(TypedDict):
    """What one layer keeps per token, as a header gives it: Layer's fields of these names."""

    has_kv: bool
    swa: bool
    k_dim: int
    v_dim: int
    state_bytes: int


@dataclass(frozen=True)
class Attention:
    """Attention as llama.cpp's KV cache sees it (llama-hparams.cpp). n_head_kv is one number, or one per layer
    where the layers differ."""

    n_embd: int
    n_head: int
    n_head_kv: int | list[int]
    key_length: int
    value_length: int
    sliding_window: int
    mla: bool
    kv_lora_rank: int
    rope_dimension_count: int


@dataclass(frozen=True)
class RopeYarn:
    """YaRN already in the file (gpt-oss, DeepSeek): its factor and the context it stretches from."""

    factor: float
    original_ctx: int


@dataclass(frozen=True)
class ModelFile:
    """One file of a model (split models have several): cheap to compute, and changes when the model does."""

    path: str
    size: int
    header_sha256: str


@dataclass(frozen=True)
class _Model:
    """What both kinds of Model have: bytes and shapes; the attention shape is a GGUF's (ModelMeta) alone, not the
    seed's constants' (SeedModel). `model` is the pipeline's name for it (config's models key)."""

    name: str
    architecture: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_ctx_train: int
    expert_bytes: int
    non_expert_bytes: int
    total_bytes: int
    global_bytes: dict[str, int]
    quant_types: dict[str, int]
    layers: list[Layer]
    files: list[ModelFile]
    attention: Attention | None
    rope_yarn: RopeYarn | None = None
    n_vocab: int = 0
    n_ff_exp: int = 0
    n_ff_dense: int = 0
    n_layer_nextn: int = 0  # NextN/MTP layers at the end: in the file, not loaded (not in the bytes above)
    nextn_bytes: int = 0
    model: str | None = None

    source = "gguf"

    def named(self, model: str) -> Self:
        return replace(self, model=model)

    def file_records(self) -> list[FileRecord]:
        """The files' identity as a measured row records it (provenance: path, size, header hash)."""
        return [FileRecord(path=f.path, size=f.size, header_sha256=f.header_sha256) for f in self.files]


@dataclass(frozen=True)
class ModelMeta(_Model):
    """A GGUF model's header, as bytes and shapes: always with its attention shape."""

    attention: Attention


@dataclass(frozen=True)
class SeedModel(_Model):
    """The seed's constants: no file, no tensors, no attention shape; the KV cache one figure per token."""

    attention: None = None
    kv_bytes_per_token: int = 0

    source = "constants"


Model: TypeAlias = ModelMeta | SeedModel


def is_seed(meta: Model) -> TypeIs[SeedModel]:
    """Whether a model is the seed's constants (no tensors to pin, no attention shape, no file)."""
    return isinstance(meta, SeedModel)


def to_json(meta: Model) -> JsonObject:
    """The stored form (results/metadata/{model}.json): the fields, `source` first after the name."""
    body = asdict(meta)
    out = {"name": body.pop("name"), "source": meta.source, **body}
    if out["model"] is None:
        del out["model"]
    return out


def from_json(data: JsonObject, where: str = "metadata") -> Model:
    """The model a stored metadata JSON describes (to_json's inverse)."""
    data = dict(data)
    kind: type[ModelMeta] | type[SeedModel] = SeedModel if data.pop("source", "gguf") == "constants" else ModelMeta
    try:
        data["layers"] = [Layer(**layer) for layer in data["layers"]]
        data["files"] = [ModelFile(**f) for f in data.get("files", [])]
        if data.get("attention") is not None:
            data["attention"] = Attention(**data["attention"])
        if data.get("rope_yarn") is not None:
            data["rope_yarn"] = RopeYarn(**data["rope_yarn"])
        known = {f.name for f in fields(kind)}
        return kind(**{k: v for k, v in data.items() if k in known})
    except (KeyError, TypeError) as e:
        raise MoeplaceError(f"{where}: not a moeplace metadata file ({e}); rerun the metadata stage.") from None


def read_metadata(path: str | Path) -> Model:
    """A stored metadata JSON (results/metadata/{model}.json)."""
    return from_json(json.loads(Path(path).read_text()), str(path))
