"""A lying or broken GGUF gives one clear MoeplaceError: never a traceback, a hang or a huge allocation.

Named corruptions pin the messages; a structure-aware fuzzer puts hostile values in every header field; three
tests pin the bugs it found (a lying block_count, a misread name quoted whole, a string copied whatever its
length).
"""

from __future__ import annotations

import resource
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from moeplace.core.errors import MoeplaceError
from moeplace.model.gguf_file import quoted
from moeplace.model.metadata import inspect_model


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    from moeplace.model.twin import load_spec, write_twin

    path = write_twin(load_spec(ROOT / "tests/specs/tiny-gpt-oss.yaml"), tmp_path_factory.mktemp("v") / "v.gguf")
    return path.read_bytes()


def expect_clean_error(path: Path, match: str | None = None) -> None:
    with pytest.raises(MoeplaceError, match=match) as err:
        inspect_model(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt) :]


@pytest.mark.parametrize(
    "case,match",
    [
        (lambda d: b"GGML" + d[4:], "wrong magic"),
        (lambda d: patch(d, 4, "<I", 7), "version 7"),
        (lambda d: patch(d, 8, "<Q", 2**63), "more than the file can hold"),
        (lambda d: patch(d, 16, "<Q", 2**62), "more than the file can hold"),
        (lambda d: patch(d, 24, "<Q", 2**60), "more than any GGUF holds"),  # first key's length
        (lambda d: d[:20], "too small|truncated"),
    ],
)
def test_named_corruptions(valid, tmp_path, case, match):
    path = tmp_path / "bad.gguf"
    path.write_bytes(case(valid))
    expect_clean_error(path, match)


def test_truncated_at_every_section(valid, tmp_path):
    path = tmp_path / "cut.gguf"
    end = len(valid)
    for cut in sorted({24, 100, 1000, 5000, end // 4, end // 2, end - 1}):
        path.write_bytes(valid[:cut])
        expect_clean_error(path)


def test_unknown_type_duplicate_name_and_misaligned_offset(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    def write(name: str, tensors) -> Path:
        w = GGUFWriter(tmp_path / name, "qwen3moe")
        w.add_uint32("qwen3moe.block_count", 1)
        w.add_uint32("qwen3moe.embedding_length", 32)
        for tname, raw in tensors:
            w.add_tensor(tname, raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return tmp_path / name

    good = write("good.gguf", [("blk.0.attn_k.weight", np.zeros((4, 32), np.float32))])
    data = good.read_bytes()
    i = data.index(b"blk.0.attn_k.weight") + len("blk.0.attn_k.weight")
    # after the name: n_dims (u32), 2 dims (u64 each), type (u32), offset (u64)
    (tmp_path / "type.gguf").write_bytes(patch(data, i + 4 + 16, "<I", 99))
    expect_clean_error(tmp_path / "type.gguf", "unknown ggml type 99")
    (tmp_path / "offset.gguf").write_bytes(patch(data, i + 4 + 16 + 4, "<Q", 3))
    expect_clean_error(tmp_path / "offset.gguf", "not aligned")
    dup = write(
        "dup.gguf",
        [
            ("blk.0.attn_k.weight", np.zeros((4, 32), np.float32)),
            ("blk.0.attn_v.weight", np.zeros((4, 32), np.float32)),
        ],
    )
    data = dup.read_bytes().replace(b"blk.0.attn_v.weight", b"blk.0.attn_k.weight")
    dup.write_bytes(data)
    expect_clean_error(dup, "appears twice")


def test_missing_architecture_keys(tmp_path):
    from conftest import write_gguf
    from gguf import GGMLQuantizationType as Q

    path = write_gguf(tmp_path / "nokeys.gguf", "qwen3moe", {}, [("blk.0.attn_k.weight", (32, 4), Q.F32)])
    expect_clean_error(path, "qwen3moe.block_count")
    # An architecture that is no name (it prefixes every key the reader looks up, and messages quote it).
    path = write_gguf(tmp_path / "garbage.gguf", "\x00" * 600, {}, [("blk.0.attn_k.weight", (32, 4), Q.F32)])
    expect_clean_error(path, "is not an architecture name")


# Byte size of each GGUF scalar value type; 8 (string) and 9 (array) are walked apart.
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
SIZES = (0, 1, 2**31, 2**32 + 7, 2**62, 2**64 - 1)  # lying lengths, counts and dims
# Hostile values for each kind of integer field (cut to the field's width). Offsets and strings are drawn apart.
HOSTILE = {
    "length": SIZES,
    "value": SIZES,
    "version": (0, 1, 2, 4, 2**32 - 1),
    "value type": (13, 2**31, 2**32 - 1, *range(13)),  # unknown, and valid but wrong
    "n_dims": (0, 5, 2**31, 1, 2, 3, 4),
    "ggml type": (39, 99, 2**32 - 1, *(t.value for t in GGMLQuantizationType)),
}
# What one mutation hits, repeated to weight the draw: tensor-info records get half of all mutations.
TARGETS = ("tensor",) * 9 + ("kv",) * 5 + ("file", "byte", "byte", "cut")
EXAMPLES = 1000
EXAMPLE_SECONDS = 2.0
EXAMPLE_HEAP = 32 * 2**20  # Python heap one example may add: ~7x the file, far below what a lying count asks
RUN_RSS = 200 * 2**20  # growth of the process's peak RSS over the whole run
ADDRESS_SPACE = 512 * 2**20  # new address space one example may map before it gets a MemoryError
MAX_MESSAGE = 1000  # a one-line error a person reads: a name misread from the data section must not be quoted whole


@dataclass(frozen=True)
class Span:
    """One field of a header; `kind` says which hostile values fit it (a string's span covers its length too)."""

    kind: str
    start: int
    size: int


@dataclass
class Layout:
    """Every field of a valid GGUF header, by section and record, and the strings and offsets to duplicate."""

    records: dict[str, list[list[Span]]] = field(default_factory=lambda: {"file": [], "kv": [], "tensor": []})
    strings: dict[str, list[bytes]] = field(default_factory=lambda: {"key": [], "text": [], "name": []})
    offsets: list[int] = field(default_factory=list)
    end: int = 0  # where the tensor-info records end: alignment padding and the data section follow


class HeaderWalker:
    """Walks a valid GGUF header field by field, independently of the reader under test."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.layout = data, 4, Layout()  # 4: after the magic
        self.spans: list[Span] = []  # the fields of the current record

    def walk(self) -> Layout:
        self.record("file")
        self.number("<I", "version")
        n_tensors, n_kv = self.number("<Q", "length"), self.number("<Q", "length")
        for _ in range(n_kv):
            self.record("kv")
            self.string("key")
            self.value(self.number("<I", "value type"))
        for _ in range(n_tensors):
            self.record("tensor")
            self.string("name")
            for _ in range(self.number("<I", "n_dims")):
                self.number("<Q", "length")
            self.number("<I", "ggml type")
            self.layout.offsets.append(self.number("<Q", "offset"))
        self.layout.end = self.pos
        return self.layout

    def record(self, section: str) -> None:
        self.spans = []
        self.layout.records[section].append(self.spans)

    def field(self, kind: str, size: int) -> None:
        self.spans.append(Span(kind, self.pos, size))
        self.pos += size

    def number(self, fmt: str, kind: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.field(kind, struct.calcsize(fmt))
        return value

    def string(self, kind: str) -> None:
        start = self.pos
        length = self.number("<Q", "length")
        self.pos += length
        self.spans.append(Span(kind, start, self.pos - start))
        self.layout.strings[kind].append(self.data[start + 8 : self.pos])

    def value(self, vtype: int) -> None:
        if vtype == 8:
            self.string("text")
        elif vtype == 9:
            etype = self.number("<I", "value type")
            for _ in range(self.number("<Q", "length")):
                self.value(etype)
        else:
            self.field("value", SCALAR_SIZES[vtype])


@pytest.fixture(scope="module")
def layout(valid) -> Layout:
    layout = HeaderWalker(valid).walk()
    # The data section is a sparse hole: a mutant gets it back by extending its file.
    assert valid[layout.end :] == bytes(len(valid) - layout.end)
    return layout


def hostile(span: Span, layout: Layout, file_size: int) -> st.SearchStrategy[bytes]:
    """Bytes to put where `span` was."""
    if span.kind in layout.strings:  # a duplicate of another such string, invalid UTF-8 or empty
        choices = [*layout.strings[span.kind], b"\xff\xfe", b""]
        return st.sampled_from(choices).map(lambda s: struct.pack("<Q", len(s)) + s)
    if span.kind == "offset":
        values = st.one_of(
            st.sampled_from(layout.offsets),  # overlapping another tensor
            st.sampled_from(layout.offsets).map(lambda o: o + 1),  # unaligned
            st.sampled_from((file_size, 2**62, 2**64 - 1)),  # past the end, huge
        )
    else:
        values = st.sampled_from(HOSTILE[span.kind])
    return values.map(lambda v: (v % 2 ** (8 * span.size)).to_bytes(span.size, "little"))


def draw_mutant(data: st.DataObject, valid: bytes, layout: Layout) -> tuple[bytes, bool, list[str]]:
    """(header, whether it was cut short, what was hit): 1-4 hostile fields, byte flips or cuts anywhere in it.

    A record, then a field, is drawn with sampled_from, which is even: st.integers over the whole header would put
    most flips and cuts in its first few hundred bytes.
    """
    anywhere = [record for records in layout.records.values() for record in records]
    edits, cuts, hit = [], [], []
    for _ in range(data.draw(st.integers(1, 4))):
        target = data.draw(st.sampled_from(TARGETS))
        hit.append(target)
        span = data.draw(st.sampled_from(data.draw(st.sampled_from(layout.records.get(target, anywhere)))))
        if target in layout.records:
            edits.append((span.start, span.start + span.size, data.draw(hostile(span, layout, len(valid)))))
            continue
        at = span.start + data.draw(st.integers(0, span.size - 1))
        if target == "cut":
            cuts.append(at)
        else:
            edits.append((at, at + 1, bytes([valid[at] ^ data.draw(st.integers(1, 255))])))
    blob = bytearray(valid[: layout.end])
    for start, end, new in sorted(edits, reverse=True):  # from the back: a resized string moves nothing still to edit
        blob[start:end] = new
    if cuts:
        del blob[min(cuts) :]
    return bytes(blob), bool(cuts), hit


class TooSlow(Exception):
    """The body of bounded() ran over its time limit."""


@contextmanager
def bounded(seconds: float):
    """Run the body under a time limit and an address-space cap, so that a regression fails the test instead of
    hanging or exhausting the machine, and measure it: the yielded dict gets its 'seconds' and peak 'heap' bytes."""

    def too_slow(signum, frame):
        raise TooSlow(f"took over {seconds} s")

    usage: dict[str, float] = {}
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = mapped + ADDRESS_SPACE if hard == resource.RLIM_INFINITY else min(mapped + ADDRESS_SPACE, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        yield usage
    finally:
        usage["seconds"] = time.perf_counter() - start
        usage["heap"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def outcome(path: Path) -> str:
    """How inspect_model takes the file: 'accepted', or 'MoeplaceError' (one short line naming the file). Any other
    exception propagates."""
    try:
        inspect_model(path)
    except MoeplaceError as e:
        message = str(e)
        assert "\n" not in message and str(path) in message and len(message) <= MAX_MESSAGE, message[:MAX_MESSAGE]
        return "MoeplaceError"
    return "accepted"


@pytest.mark.fault(
    fault="a corrupt or lying GGUF",
    injected="1,000 mutations of whole headers: KV and tensor-info records, flips, cuts",
    sees="one line naming the file, never a traceback",
    kept="bounded time (< 2 s) and memory per file; nothing else runs",
)
def test_whole_header_mutations_never_escape_as_tracebacks(valid, layout, tmp_path):
    """Hostile values in every header field give one clean line, in bounded time and memory.

    The header of the tiny gpt-oss twin is walked once into spans: the counts, every KV record (key, value
    type, value, array length and items) and every tensor-info record (name, n_dims, dims, type id, offset).
    Each example writes 1-4 field-appropriate lies (lengths and dims of 0, 1, 2**31, 2**32+7, 2**62, 2**64-1;
    unknown and valid-but-wrong types; unaligned, overlapping, huge and past-the-end offsets; duplicate,
    invalid or empty names), byte flips or truncations anywhere in it, half of them in tensor-info records,
    and keeps the data section. A prefix-only fuzzer never reached the tensor table.
    """
    path = tmp_path / "mutant.gguf"
    outcomes, hits = Counter(), Counter()
    slowest = heap = 0.0

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(data=st.data())
    def one(data):
        nonlocal slowest, heap
        header, cut, hit = draw_mutant(data, valid, layout)
        with path.open("wb") as f:
            f.write(header)
            if not cut:
                f.truncate(len(header) + len(valid) - layout.end)
        with bounded(EXAMPLE_SECONDS) as usage:
            result = outcome(path)
        outcomes[result] += 1
        assert usage["seconds"] < EXAMPLE_SECONDS and usage["heap"] < EXAMPLE_HEAP, usage
        slowest, heap = max(slowest, usage["seconds"]), max(heap, usage["heap"])
        hits.update(hit)

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    one()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss
    examples = outcomes["accepted"] + outcomes["MoeplaceError"]
    share = ", ".join(f"{k} {v / hits.total():.0%}" for k, v in hits.most_common())
    print(
        f"\nwhole-header fuzzer: {examples} examples: {outcomes['accepted']} accepted, "
        f"{outcomes['MoeplaceError']} MoeplaceError; mutations: {share}; "
        f"slowest {slowest:.3f} s; peak heap {heap / 2**20:.1f} MB; RSS growth {rss / 2**20:.0f} MB"
    )
    assert examples >= EXAMPLES and rss < RUN_RSS


def mutate_field(valid: bytes, layout: Layout, section: str, name: bytes, kind: str, value: int) -> bytes:
    """`valid` with the `kind` field of the KV or tensor record called `name` set to `value`."""
    names = layout.strings["key" if section == "kv" else "name"]
    span = next(s for s in layout.records[section][names.index(name)] if s.kind == kind)
    return valid[: span.start] + value.to_bytes(span.size, "little") + valid[span.start + span.size :]


def test_huge_block_count_is_a_clean_error(valid, layout, tmp_path):
    path = tmp_path / "layers.gguf"
    path.write_bytes(mutate_field(valid, layout, "kv", b"gpt-oss.block_count", "value", 2**32 - 1))
    with bounded(EXAMPLE_SECONDS):
        expect_clean_error(path, "block_count")


def test_a_misread_name_is_quoted_short(valid, layout, tmp_path):
    # One dimension fewer: the next name's length is read from a dim, and the name runs into the data section.
    path = tmp_path / "dims.gguf"
    path.write_bytes(mutate_field(valid, layout, "tensor", b"blk.3.ffn_down_exps.weight", "n_dims", 2))
    with pytest.raises(MoeplaceError) as err:
        inspect_model(path)
    length = len(str(err.value))
    assert length <= MAX_MESSAGE, f"a {length:,}-character message"
    # A name of control bytes takes four characters each to quote (the fuzzer found one at 1,600): its start only.
    for garbage in (quoted("\x00\n" * 512), quoted("\U000e0001" * 256)):  # 4 and 10 characters each
        assert len(garbage) < 120 and "\n" not in garbage and "characters)" in garbage


def test_a_lying_string_length_costs_no_memory(valid, layout, tmp_path):
    # general.name claims 60 MB of a 64 MB file (sparse: its data section is a hole).
    path = tmp_path / "name.gguf"
    with path.open("wb") as f:
        f.write(mutate_field(valid, layout, "kv", b"general.name", "length", 60 * 2**20)[: layout.end])
        f.truncate(64 * 2**20)
    with bounded(EXAMPLE_SECONDS) as usage:
        expect_clean_error(path)
    assert usage["heap"] < EXAMPLE_HEAP, f"{usage['heap'] / 2**20:.0f} MB"


def test_cli_on_a_hostile_file_is_one_line(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40))
    out = subprocess.run(
        [sys.executable, "-m", "moeplace.cli", "inspect", str(path)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
