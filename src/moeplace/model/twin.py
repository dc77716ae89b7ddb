"""Stage 'twin': a GGUF with a real architecture's llama.cpp tensor names, shapes and types.

weights="none": header-faithful, data region a sparse hole, tensor types from llama.cpp's
quantization recipe (llama-quant.cpp) so `inspect` reports the real model's bytes.
weights="random": F16/F32 random weights (deterministic seed) that llama.cpp loads and runs;
quantize it with llama-quantize to get the real recipe's types.
weights="blocks": the recipe's types written directly as random quantized blocks with small finite scales:
a full-size model llama.cpp runs, made without an F16 copy twice its size (random routing, nonsense text).
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import yaml
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType

from ..core.errors import MoeplaceError
from ..runtime.build import Build
from ..runtime.llamacpp import require_binary
from ..runtime.outputs import atomic_path
from ..runtime.process import run_checked
from .architectures import ARCHITECTURES, MODULES
from .architectures._spec import ArchParams, GGUFKeys, TwinSpec
from .gguf_file import tensor_nbytes
from .recipe import PRESETS, UNQUANTIZED, fit, keeps_source_type, override, quantized_types

Q = GGMLQuantizationType


def _same_kind(value: object, default: object) -> bool:
    """A spec's value for an architecture parameter is of its default's kind (an int will do for a float)."""
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    return isinstance(value, (int, float) if isinstance(default, float) else type(default))


def load_spec(path: str | Path) -> TwinSpec[ArchParams]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise MoeplaceError(f"{path}: cannot read the twin spec ({e}).") from None
    if not isinstance(data, dict):
        raise MoeplaceError(f"{path}: a twin spec is a YAML mapping of hyperparameters.")
    module = MODULES.get(str(data.get("architecture")))
    if module is None:
        raise MoeplaceError(
            f"{path}: architecture {data.get('architecture')!r} is not one of {', '.join(ARCHITECTURES)}."
        )
    kind: type[ArchParams] = module.Params
    defaults = asdict(kind())
    common = set(TwinSpec.__dataclass_fields__) - {"params"}
    unknown = sorted(set(data) - common - set(defaults))
    if unknown:
        raise MoeplaceError(f"{path}: unknown key(s) {', '.join(unknown)}; see config/models/README.md.")
    given = {k: v for k, v in data.items() if k in defaults}
    for key, default in defaults.items():
        if not _same_kind(value := given.get(key, default), default):
            raise MoeplaceError(f"{path}: {key} must be a {type(default).__name__}, like {default!r}; got {value!r}.")
    try:
        spec = TwinSpec(**{k: v for k, v in data.items() if k in common}, params=kind(**given))
    except TypeError as e:
        raise MoeplaceError(f"{path}: {e}; see config/models/README.md.") from None
    if spec.ftype not in PRESETS:
        raise MoeplaceError(f"{path}: ftype {spec.ftype!r} is not a llama-quantize preset ({', '.join(PRESETS)}).")
    for pattern, type_name in spec.tensor_types.items():
        try:
            re.compile(pattern)
        except re.error as e:
            raise MoeplaceError(f"{path}: tensor_types pattern {pattern!r} is not a regex ({e}).") from None
        if type_name not in Q.__members__:
            raise MoeplaceError(f"{path}: tensor_types type {type_name!r} for {pattern!r} is not a ggml type name.")
    return spec


def common_metadata(s: TwinSpec[ArchParams]) -> GGUFKeys:
    """The GGUF keys every architecture's converter writes; the architecture module adds or replaces some."""
    a = s.architecture
    keys: GGUFKeys = {
        "general.name": s.name,
        f"{a}.context_length": s.context_length,
        f"{a}.embedding_length": s.n_embd,
        f"{a}.block_count": s.n_layer,
        f"{a}.feed_forward_length": s.n_ff or s.n_ff_exp,
        f"{a}.attention.head_count": s.n_head,
        f"{a}.attention.head_count_kv": s.n_head_kv,
        f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.freq_base": float(s.rope_freq_base),
    }
    if s.n_expert:
        keys[f"{a}.expert_count"] = s.n_expert
        keys[f"{a}.expert_used_count"] = s.n_expert_used
        keys[f"{a}.expert_feed_forward_length"] = s.n_ff_exp
    # llama.cpp's minimal "test" vocabulary: unique token strings, no merges needed.
    keys["tokenizer.ggml.model"] = "test"
    keys["tokenizer.ggml.tokens"] = [f"tok_{i}" for i in range(s.n_vocab)]
    keys["tokenizer.ggml.scores"] = [0.0] * s.n_vocab
    return keys


def gguf_keys(s: TwinSpec[ArchParams]) -> GGUFKeys:
    """Every GGUF key the twin carries: the common ones with its architecture module's additions."""
    own: GGUFKeys = MODULES[s.architecture].metadata(s)
    return {**common_metadata(s), **own}


def _write_metadata(w: GGUFWriter, s: TwinSpec[ArchParams]) -> None:
    for key, value in gguf_keys(s).items():
        if value is None:
            continue
        if isinstance(value, tuple):
            w.add_key_value(key, value[0], value[1])
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)


def _tensors(s: TwinSpec[ArchParams]) -> list[tuple[str, tuple[int, ...]]]:
    tensors: list[tuple[str, tuple[int, ...]]] = MODULES[s.architecture].tensors(s)
    return tensors


# --- each tensor's type -----------------------------------------------------------------


def twin_types(spec: TwinSpec[ArchParams], tensors: list[tuple[str, tuple[int, ...]]] | None = None) -> dict[str, Q]:
    """Each tensor's type in a header-only (or blocks) twin: what llama-quantize gives it for the spec's ftype
    (recipe.py), the spec's tensor_types first; with an unquantized ftype, tensor_types still apply: a converter's
    own mix, as gpt-oss's MXFP4 experts (llama-quantize ignores --tensor-type there)."""
    tensors = tensors or _tensors(spec)
    a = spec.architecture
    keys = gguf_keys(spec)

    def first(value: object) -> int:
        """An integer key's value (a per-layer array's: the first layer's)."""
        number = value[0] if isinstance(value, list) else value
        assert isinstance(number, int), value
        return number

    heads = first(keys[f"{a}.attention.head_count"])
    heads_kv = first(keys.get(f"{a}.attention.head_count_kv") or heads)
    types = quantized_types(
        tensors,
        spec.ftype,
        n_layer=first(keys[f"{a}.block_count"]),
        n_expert=first(keys.get(f"{a}.expert_count") or 0),
        n_gqa=heads // heads_kv if heads_kv else 0,
        overrides=spec.tensor_types,
    )
    if PRESETS[spec.ftype] in UNQUANTIZED:
        for name, shape in tensors:
            chosen = override(name, spec.tensor_types)
            if chosen is not None and not keeps_source_type(name, shape):
                types[name] = fit(chosen, shape[0])
    return types


def _random_types(spec: TwinSpec[ArchParams], tensors: list[tuple[str, tuple[int, ...]]]) -> dict[str, Q]:
    """What llama.cpp's converter writes for an F16 model: F32 for norms, biases, routers, 1-D."""
    return {name: Q.F32 if keeps_source_type(name, shape) else Q.F16 for name, shape in tensors}


def _random_data(rng: np.random.Generator, name: str, shape: tuple[int, ...], qtype: Q) -> np.ndarray:
    dtype = np.float32 if qtype == Q.F32 else np.float16
    if "norm" in name:
        return np.ones(shape[::-1], dtype=dtype)
    # Random, not zero: zero routers would send every token to the same experts.
    scale = 1.0 / math.sqrt(shape[0])
    return (rng.standard_normal(shape[::-1], dtype=np.float32) * scale).astype(dtype)


# Where a block's f16 scales sit (ggml-common.h): random bytes with these set to small finite values are valid
# weights of that type.
_BLOCK_SCALES = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}
_BLOCK_POOL = 4096  # distinct random blocks per tensor, repeated to its size


def _random_blocks(rng: np.random.Generator, name: str, shape: tuple[int, ...], qtype: Q) -> np.ndarray:
    """A quantized tensor's bytes: random blocks whose scales keep a row's dot product near unit size."""
    if qtype in (Q.F32, Q.F16):
        return _random_data(rng, name, shape, qtype)
    if qtype not in _BLOCK_SCALES and qtype != Q.MXFP4:
        raise MoeplaceError(f"random blocks of type {qtype.name} are not supported; use weights: random.")
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = math.prod(shape) // block
    pool = rng.integers(0, 256, size=(min(n_blocks, _BLOCK_POOL), size), dtype=np.uint8)
    scale = np.full(len(pool), 1 / (256 * math.sqrt(shape[0])), dtype=np.float16).view(np.uint8).reshape(-1, 2)
    if qtype == Q.MXFP4:  # one e8m0 exponent byte per block
        pool[:, 0] = 127 - 8
    for offset in _BLOCK_SCALES.get(qtype, ()):
        pool[:, offset : offset + 2] = scale
    return np.resize(pool, (n_blocks, size))


def _writable_gguf_path(out: str | Path) -> Path:
    """The twin's path, refused in one sentence where it names a folder, or a folder that does not exist (a typo there
    is not a folder to make)."""
    path = Path(out)
    if path.is_dir() or str(out).endswith(("/", "\\")):
        raise MoeplaceError(f"{out} is a folder: name the twin's file, e.g. {path / 'twin.gguf'}.")
    if not path.parent.is_dir():
        raise MoeplaceError(f"{path.parent} is not an existing folder: create it first (mkdir -p {path.parent}).")
    return path


def write_twin(
    spec: TwinSpec[ArchParams], out: str | Path, weights: str = "none", seed: int = 0, shard_bytes: int = 0
) -> Path:
    """Write the twin GGUF atomically; returns its path. A header-only twin can be split into shards of at most
    `shard_bytes`, named as llama-gguf-split names them (OUT-00001-of-0000N.gguf); the first shard's path is
    returned."""
    if weights not in ("none", "random", "blocks"):
        raise MoeplaceError(f"twin weights must be 'none', 'random' or 'blocks', not {weights!r}.")
    if shard_bytes and weights != "none":
        raise MoeplaceError("only a header-only twin (weights none) is split into shards.")
    tensors = _tensors(spec)
    types = _random_types(spec, tensors) if weights == "random" else twin_types(spec, tensors)
    out = _writable_gguf_path(out)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        w = GGUFWriter(scratch / out.name, spec.architecture, split_max_size=shard_bytes)
        _write_metadata(w, spec)
        file_type = "F16" if weights == "random" else spec.ftype
        w.add_file_type(LlamaFileType["ALL_F32" if file_type == "F32" else f"MOSTLY_{file_type}"])
        for name, shape in tensors:
            nbytes = tensor_nbytes(types[name].name, shape)
            w.add_tensor_info(name, list(reversed(shape)), np.dtype(np.float32), nbytes, raw_dtype=types[name])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        if weights == "none":
            assert w.fout is not None  # opened by write_header_to_file
            for f, shard in zip(w.fout, w.tensors):
                w.write_padding(f, f.tell())
                data = sum(GGUFWriter.ggml_pad(t.nbytes, w.data_alignment) for t in shard.values())
                f.truncate(f.tell() + data)  # a sparse hole: the size is real, the bytes are not
        else:
            rng = np.random.default_rng(seed)
            fill = _random_data if weights == "random" else _random_blocks
            for name, shape in tensors:
                w.write_tensor_data(fill(rng, name, shape, types[name]))
        w.close()
        written = sorted(scratch.iterdir())
        for path in written[::-1]:  # the first shard last: a reader finds the set whole or not at all
            path.chmod(0o644)
            path.replace(out.parent / path.name)
        return out.parent / written[0].name
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def tensor_type_args(tensor_types: dict[str, str]) -> list[str]:
    """A spec's tensor_types as llama-quantize's --tensor-type arguments."""
    return [arg for p, t in tensor_types.items() for arg in ("--tensor-type", f"{p}={t.lower()}")]


def quantize(
    llamacpp: Build,
    f16: str | Path,
    out: str | Path,
    quant: str,
    log_file: str | Path,
    tensor_types: dict[str, str] | None = None,
) -> Path:
    """llama-quantize an F16 twin to `quant` (its real recipe, with `tensor_types` overrides), written atomically."""
    out = Path(out)
    with atomic_path(out) as tmp:
        cmd = [
            str(require_binary(llamacpp, "llama-quantize")),
            *tensor_type_args(tensor_types or {}),
            str(f16),
            str(tmp),
            quant,
        ]
        run_checked(cmd, f"llama-quantize making a {quant} file from {f16}", log_file, stream_to_log=True)
    return out


def make_twin(
    spec: TwinSpec[ArchParams],
    out: str | Path,
    weights: str,
    quant: str,
    seed: int,
    llamacpp: Build | None,
    log_file: str | Path,
) -> Path:
    """A twin as the pipeline needs it: sparse (weights none), random blocks in the spec's recipe (blocks), or
    random F16 quantized by llama-quantize (random)."""
    if weights in ("none", "blocks"):
        return write_twin(spec, out, weights, seed)
    assert llamacpp is not None
    out = Path(out)
    with atomic_path(out.with_name(out.name + ".f16")) as f16:
        write_twin(spec, f16, "random", seed)
        quantize(llamacpp, f16, out, quant, log_file, spec.tensor_types)
        f16.unlink()
    return out
