"""A strict, bounded reader for GGUF headers and tensor tables.

Only the header is read (through mmap, so a 100 GB model costs no RAM); tensor data is
never touched. Every count and length is checked against the bytes that remain before it
is trusted, so a lying file fails fast with one clear line instead of a huge allocation.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys

from ..core.errors import MoeplaceError
from ..runtime.model_ref import is_remote
from ..runtime.remote import NeedMore, read_remote, shard_urls

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are kept as a length only: per-layer arrays are short, while
# tokenizer arrays (tokens, merges, scores) are long and never needed here.
MAX_KEPT_ARRAY = 4096
MAX_DIMS = 4
# What a real file never exceeds (ggml names are 64 bytes; chat templates are kilobytes; vocabularies hold
# ~10^5-10^6 tokens): a lying length or count fails here, before anything of its size is read or kept.
MAX_NAME = 1024
ARCHITECTURE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_STRING = 16 * 2**20
MAX_STRINGS = 2**24
# A metadata value as read: a number, bool or string, an array of them (an array of arrays: nested lists), or
# {"array_length": n} for an array too long to keep.
GGUFValue: TypeAlias = bool | int | float | str | list[Any] | dict[str, int]
Metadata: TypeAlias = dict[str, GGUFValue]

# A scalar value type -> (struct format, size); STRING and ARRAY are read by their own methods.
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (row length) first
    type_name: str
    n_bytes: int
    offset: int  # relative to the data section of its file
    shard: int = 0  # index of that file among the model's shards


@dataclass
class GGUFHeader:
    """Metadata and tensor table of one model (all shards of a split model)."""

    paths: list[Path | str]  # str: the URL of a remote model
    metadata: Metadata
    tensors: list[TensorInfo]
    file_sizes: list[int] = field(default_factory=list)
    header_sha256: list[str] = field(default_factory=list)
    data_starts: list[int] = field(default_factory=list)  # where each shard's data section begins

    def file_range(self, t: TensorInfo) -> tuple[Path | str, int, int]:
        """(file, absolute offset, bytes) of one tensor's data."""
        return self.paths[t.shard], self.data_starts[t.shard] + t.offset, t.n_bytes

    @property
    def architecture(self) -> str:
        arch = self.metadata.get(Keys.General.ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            raise MoeplaceError(
                f"{self.paths[0]}: the GGUF has no 'general.architecture' key; it is not a llama.cpp model file."
            )
        if not ARCHITECTURE_NAME.fullmatch(arch):  # it prefixes keys and is quoted in messages as it is
            raise MoeplaceError(
                f"{self.paths[0]}: general.architecture {quoted(arch)} is not an architecture name; "
                "the file is damaged or not a llama.cpp model file."
            )
        return arch

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


_U64 = struct.Struct("<Q")


class _Cursor:
    """Bounds-checked reads from a mapped file, or from the first bytes of a file of `size` bytes."""

    def __init__(self, path: Path | str, buf: mmap.mmap | bytes, size: int | None = None):
        self.path = path
        self.buf = buf
        self.pos = 0
        self.size = len(buf) if size is None else size

    def fail(self, what: str) -> MoeplaceError:
        return MoeplaceError(f"{self.path}: {what} (at byte {self.pos}); the file is damaged or not a GGUF model.")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated: {what} runs past the end of the file")
        if self.pos + n > len(self.buf):
            raise NeedMore(self.pos + n)

    def scalar(self, vtype: int, what: str) -> int | float:
        fmt, size = _SCALARS[vtype]
        self.need(size, what)
        value: int | float
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT32, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT64, what))

    def string(self, what: str, limit: int = MAX_STRING) -> str:
        n = self.u64(f"length of {what}")
        if n > limit:
            raise self.fail(f"{what} claims {n} bytes, more than any GGUF holds ({limit})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def skip_string(self, what: str) -> None:
        n = self.u64(f"length of {what}")
        if n > MAX_STRING:
            raise self.fail(f"{what} claims {n} bytes, more than any GGUF holds ({MAX_STRING})")
        self.need(n, what)
        self.pos += n

    def skip_strings(self, key: str, count: int) -> None:
        """Skip an array's `count` strings (a tokenizer's vocabulary, 150,000 of them: most of a header's read).
        A tight loop while every string is in bounds; from the first that is not, skip_string's checked path,
        which names the string and raises as it does."""
        buf, pos, end = self.buf, self.pos, min(self.size, len(self.buf))
        unpack = _U64.unpack_from
        for i in range(count):
            if pos + 8 > end:
                break
            (n,) = unpack(buf, pos)
            if n > MAX_STRING or pos + 8 + n > end:
                break
            pos += 8 + n
        else:
            self.pos = pos
            return
        self.pos = pos
        for j in range(i, count):
            self.skip_string(f"{key}[{j}]")

    def value(self, vtype: int, key: str) -> GGUFValue:
        if vtype in _SCALARS:
            return self.scalar(vtype, f"value of {key}")
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key}")
        if vtype == GGUFValueType.ARRAY:
            return self.array(key)
        raise self.fail(f"key {key} has unknown value type {vtype}")

    def array(self, key: str) -> list[Any] | dict[str, int]:
        etype = self.u32(f"element type of {key}")
        count = self.u64(f"length of {key}")
        if etype in _SCALARS:
            _, size = _SCALARS[etype]
            self.need(count * size, f"array {key}")
            if count > MAX_KEPT_ARRAY:
                self.pos += count * size
                return {"array_length": count}
            fmt = "<" + _SCALARS[etype][0][1] * count
            values = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += count * size
            return values
        if etype == GGUFValueType.STRING:
            # Each string needs at least its 8-byte length: a lying count fails here.
            self.need(count * 8, f"array {key}")
            if count > MAX_STRINGS:
                raise self.fail(f"array {key} claims {count} strings, more than any GGUF holds ({MAX_STRINGS})")
            if count > MAX_KEPT_ARRAY:
                self.skip_strings(key, count)
                return {"array_length": count}
            return [self.string(f"{key}[{i}]") for i in range(count)]
        raise self.fail(f"array {key} has unsupported element type {etype}")


def quoted(value: Any, keep: int = 80) -> str:
    """A value read from a file, as Python writes it, cut for a one-line message: a name misread from garbage can
    be a kilobyte of control bytes, each written as four characters or more, and a value megabytes long."""
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    text = repr(value[:keep] if isinstance(value, str) else value)
    if isinstance(value, str) and len(value) > keep:
        return f"{text[:keep]}... ({len(value)} characters)"
    return text if len(text) <= keep else f"{text[:keep]}..."


def _type_name(type_id: int, path: Path | str, shown: str) -> tuple[str, int]:
    """The ggml type's name and block size; `shown` is the tensor's name as messages quote it."""
    try:
        qtype = GGMLQuantizationType(type_id)
        block = GGML_QUANT_SIZES[qtype][0]
    except (ValueError, KeyError):
        raise MoeplaceError(
            f"{path}: tensor {shown} has unknown ggml type {type_id}; update moeplace's gguf package or check the file."
        ) from None
    return qtype.name, block


def tensor_nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor as ggml stores it (row size x rows)."""
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    rows = 1
    for d in shape[1:]:
        rows *= d
    return shape[0] // block * type_size * rows


def _read_one(path: Path) -> tuple[Metadata, list[TensorInfo], int, str, int]:
    try:
        fh = path.open("rb")
    except OSError as e:
        raise MoeplaceError(f"{path}: cannot open the model file ({e.strerror}).") from None
    with fh:
        size = path.stat().st_size
        if size < 24:
            raise MoeplaceError(f"{path}: only {size} bytes; too small to be a GGUF file.")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return parse_header(path, buf, size)


def parse_header(
    path: Path | str, buf: mmap.mmap | bytes, size: int
) -> tuple[Metadata, list[TensorInfo], int, str, int]:
    """Parse a header from `buf`, the whole file or its first bytes (NeedMore: read further and parse again)."""
    cur = _Cursor(path, buf, size)
    if len(buf) < 4:
        raise NeedMore(4)
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise MoeplaceError(f"{path}: wrong magic {bytes(buf[:4])!r}; this is not a GGUF file.")
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise MoeplaceError(f"{path}: GGUF version {version} is not supported (only 2 and 3); re-convert the model.")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # Each metadata entry takes >= 13 bytes, each tensor entry >= 24: bound the counts.
    if n_kv * 13 > size - cur.pos or n_tensors * 24 > size - cur.pos:
        raise cur.fail(f"claims {n_kv} metadata entries and {n_tensors} tensors, more than the file can hold")
    metadata = _read_metadata(cur, n_kv)
    tensors = _read_tensors(cur, n_tensors)
    alignment = metadata.get(Keys.General.ALIGNMENT, DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {quoted(alignment)} is not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    header_sha = hashlib.sha256(bytes(buf[: cur.pos])).hexdigest()
    _check_data(path, tensors, alignment, data_start, size)
    return metadata, tensors, size, header_sha, data_start


def _read_metadata(cur: _Cursor, n_kv: int) -> Metadata:
    metadata: Metadata = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", MAX_NAME)
        shown = quoted(key)
        vtype = cur.u32(f"type of {shown}")
        if key in metadata:
            raise cur.fail(f"metadata key {shown} appears twice")
        metadata[key] = cur.value(vtype, shown)
    return metadata


def _read_tensors(cur: _Cursor, n_tensors: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}", MAX_NAME)
        shown = quoted(name)
        if name in seen:
            raise cur.fail(f"tensor {shown} appears twice")
        seen.add(name)
        n_dims = cur.u32(f"dimension count of {shown}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {shown} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        shape = tuple(cur.u64(f"shape of {shown}") for _ in range(n_dims))
        type_name, block = _type_name(cur.u32(f"type of {shown}"), cur.path, shown)
        offset = cur.u64(f"data offset of {shown}")
        if any(d <= 0 for d in shape) or shape[0] % block:
            raise cur.fail(f"tensor {shown} has shape {list(shape)}, invalid for type {type_name}")
        tensors.append(TensorInfo(name, shape, type_name, tensor_nbytes(type_name, shape), offset))
    return tensors


def _check_data(path: Path | str, tensors: list[TensorInfo], alignment: int, data_start: int, size: int) -> None:
    """Every tensor's data aligned and inside the file."""
    for t in tensors:
        if t.offset % alignment:
            raise MoeplaceError(
                f"{path}: tensor {quoted(t.name)} data offset {t.offset} is not aligned to {alignment}."
            )
        if data_start + t.offset + t.n_bytes > size:
            raise MoeplaceError(
                f"{path}: tensor {quoted(t.name)} ends past the end of the file; the download is incomplete."
            )


def shard_paths(path: Path) -> list[Path]:
    """All shards of a split model given any one of them (or just the file itself)."""
    m = _SPLIT_NAME.match(path.name)
    if not m:
        return [path]
    count = int(m["count"])
    paths = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise MoeplaceError(f"{path}: split model is missing shard(s) {', '.join(missing)}; download all of them.")
    return paths


def read_header(path: str | Path) -> GGUFHeader:
    """Read the header and tensor table of a model, every shard of a split model included; an http(s) URL is
    read with range requests, header only."""
    paths: list[Path | str] = [*shard_urls(str(path))] if is_remote(str(path)) else [*shard_paths(Path(path))]

    def read(shard: Path | str) -> tuple[Metadata, list[TensorInfo], int, str, int]:
        return read_remote(shard, parse_header) if isinstance(shard, str) else _read_one(shard)

    header = GGUFHeader(paths=paths, metadata={}, tensors=[])
    names: set[str] = set()
    for no, shard in enumerate(paths, start=1):
        metadata, tensors, size, sha, data_start = read(shard)
        if len(paths) > 1:
            count, split_no = metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT), metadata.get(Keys.Split.LLM_KV_SPLIT_NO)
            if count != len(paths) or split_no != no - 1:
                raise MoeplaceError(
                    f"{shard}: its split.count/split.no ({quoted(count)}/{quoted(split_no)}) do not "
                    f"match shard {no} of {len(paths)}; the shards come from different models."
                )
        if no == 1:
            header.metadata = metadata
        for t in tensors:
            if t.name in names:
                raise MoeplaceError(f"{shard}: tensor {quoted(t.name)} also appears in another shard.")
            names.add(t.name)
        header.tensors.extend(replace(t, shard=no - 1) for t in tensors)
        header.file_sizes.append(size)
        header.data_starts.append(data_start)
        header.header_sha256.append(sha)
    expected = header.metadata.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if len(paths) > 1 and expected is not None and expected != len(header.tensors):
        raise MoeplaceError(
            f"{paths[0]}: the shards hold {len(header.tensors)} tensors, but split.tensors.count says "
            f"{quoted(expected)}."
        )
    return header
