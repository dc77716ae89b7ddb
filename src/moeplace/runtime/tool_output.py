"""What llama.cpp's tools and the GPU vendors' tools print, on any backend: `--list-devices`, llama-bench's records
(json, jsonl, csv, markdown), llama-fit-params' arguments, nvidia-smi's CSV query and rocm-smi.
Every reader is tested on real output from real cards (tests/data/llamacpp/).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from dataclasses import dataclass
from typing import NotRequired, TypedDict, cast

from ..core.records import LlamaBenchRow
from .llama_names import MiB

# --list-devices (and rpc-server's "Devices:"): "  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23582 MiB free)"; older
# Metal builds name their device "Metal"; llama-server's start-up block: "0.00.077.728 I   - MTL0    : Apple M5 Max".
_LIST_DEVICE = re.compile(
    r"^(?:[\d.]+ [IWE])?\s*(?:- )?(?P<name>[A-Za-z]\w*(?:\[[^\]]*\])?)\s*: (?P<description>.*) "
    r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)


@dataclass
class Device:
    name: str  # as llama.cpp names it: CUDA0, ROCm0, Vulkan1, MTL0, SYCL0, RPC0
    description: str  # the card: "NVIDIA GeForce RTX 4090"
    total_bytes: int
    free_bytes: int


class SmiGpu(TypedDict):
    """A card as nvidia-smi or rocm-smi reports it: its name and, where the tool printed them, its total, used and
    free memory in MiB. nvidia-smi's other queried fields (compute_cap, driver_version, ...) follow as printed."""

    name: str | None
    total_mib: NotRequired[float | None]
    used_mib: NotRequired[float | None]
    free_mib: NotRequired[float | None]
    compute_cap: NotRequired[str]


def list_devices(text: str) -> list[Device]:
    """The devices `llama-bench --list-devices` (or llama-server's) prints, with their total and free memory."""
    devices = []
    for line in text.splitlines():
        if m := _LIST_DEVICE.match(line):
            devices.append(Device(m["name"], m["description"].strip(), int(m["total"]) * MiB, int(m["free"]) * MiB))
    return devices


# llama-bench's records as it printed them (LlamaBenchRow): which fields a row has changes with llama-bench's version,
# and a markdown row has only its table's columns.
def bench_records(stdout: str) -> list[LlamaBenchRow]:
    """llama-bench's `-o jsonl` records, whole lines only: a stopped or killed run may have been cut mid-line."""
    records: list[LlamaBenchRow] = []
    for line in stdout[: stdout.rfind("\n") + 1].splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # another process's output interleaved into the line
                continue
    return records


def garbled_records(stdout: str) -> int:
    """Whole lines that start like a record but are not JSON (bench_records leaves them out)."""
    whole = stdout[: stdout.rfind("\n") + 1].splitlines()
    return sum(1 for line in whole if line.startswith("{")) - len(bench_records(stdout))


def _number(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


# llama-bench's markdown test names: "pp512", "tg128", "pp512 @ d4096", "pp512+tg128".
_MD_TEST = re.compile(r"^(?:pp(?P<pp>\d+))?\+?(?:tg(?P<tg>\d+))?(?: @ d(?P<depth>\d+))?$")
_MD_SPEED = re.compile(r"^(?P<avg>[\d.]+)(?: ± (?P<sd>[\d.]+))?$")
_MD_FIELDS = {
    "ngl": "n_gpu_layers",
    "n_cpu_moe": "n_cpu_moe",
    "threads": "n_threads",
    "n_ubatch": "n_ubatch",
    "n_batch": "n_batch",
    "type_k": "type_k",
    "type_v": "type_v",
    "fa": "flash_attn",
    "ot": "tensor_buft_overrides",
    "backend": "backends",
    "model": "model_type",
    "size": "model_size",
    "params": "model_n_params",
    "mmap": "use_mmap",
    "dev": "devices",
}


def _markdown_records(text: str) -> list[LlamaBenchRow]:
    records: list[LlamaBenchRow] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.strip().startswith("|") else None
        if not cells:
            header = None
            continue
        if "test" in cells and ("t/s" in cells or "tok/s" in cells):
            header = cells
        elif header and not set(line.replace("|", "").strip()) <= set("-: "):
            row = dict(zip(header, cells))
            record: dict[str, int | float | str | None] = {
                _MD_FIELDS.get(k, k): _number(v) if k not in ("model", "backend", "ot") else v
                for k, v in row.items()
                if k not in ("test", "t/s", "tok/s")
            }
            test = _MD_TEST.match(row["test"])
            speed = _MD_SPEED.match(row.get("t/s", row.get("tok/s", "")))
            if test:
                record.update(
                    n_prompt=int(test["pp"] or 0), n_gen=int(test["tg"] or 0), n_depth=int(test["depth"] or 0)
                )
            if speed:
                record.update(avg_ts=float(speed["avg"]), stddev_ts=float(speed["sd"]) if speed["sd"] else None)
            records.append(cast(LlamaBenchRow, record))  # the table's columns under llama-bench's JSON names
    return records


def read_bench(text: str) -> list[LlamaBenchRow]:
    """llama-bench's records in any of its output formats: `-o json` (an array), `jsonl`, `csv` or `md` (the
    default table a user pastes). Markdown rows get n_prompt, n_gen, n_depth, avg_ts and stddev_ts from their
    test and t/s cells, and llama-bench's JSON field names for the columns that have one."""
    stripped = text.strip()
    if stripped.startswith("["):
        rows: list[LlamaBenchRow] = json.loads(stripped[: stripped.rfind("]") + 1])
        return rows
    if stripped.startswith("{"):
        return bench_records(stripped + "\n")
    if stripped.startswith(("build_commit", '"build_commit"')):
        return [
            cast(LlamaBenchRow, {k: _number(v) for k, v in row.items()})
            for row in csv.DictReader(io.StringIO(stripped))
        ]
    return _markdown_records(text)


def fitted_args(stdout: str) -> list[str]:
    """The arguments llama-fit-params printed last (`-c 4096 -ngl 48 -ot "blk\\.14\\.ffn_...=CPU,..."`), split as a
    shell would, its regex backslashes kept (builds before 2026 printed the -ot value unquoted)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip().startswith("-")]
    if not lines:
        return []
    lexer = shlex.shlex(lines[-1], posix=True)
    lexer.whitespace_split, lexer.escape = True, ""
    return list(lexer)


def _mib(cell: str) -> int | None:
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*(MiB)?\s*$", cell)
    return round(float(m[1])) if m else None


def nvidia_smi_csv(text: str, fields: tuple[str, ...] = ("name", "memory.total", "memory.free")) -> list[SmiGpu]:
    """nvidia-smi --query-gpu=... --format=csv (with its header, `[MiB]` units or none), or with noheader in
    `fields`' order: per GPU its name, total/used/free MiB and any other field queried, as printed. Lines pasted
    as quotes ("> ") and the command line itself are skipped."""
    lines = [re.sub(r"^>\s?", "", line).strip() for line in text.strip().splitlines()]
    rows = list(
        csv.reader([line for line in lines if line and not line.startswith("nvidia-smi")], skipinitialspace=True)
    )
    if rows and any(cell.startswith("memory.") or cell in ("name", "gpu_name") for cell in rows[0]):
        fields, rows = tuple(cell.split(" [")[0].strip() for cell in rows[0]), rows[1:]
    gpus = []
    for row in rows:
        cells = dict(zip(fields, (c.strip() for c in row)))
        gpu: SmiGpu = {"name": cells.pop("name", cells.pop("gpu_name", None))}
        if "memory.total" in cells:
            gpu["total_mib"] = _mib(cells.pop("memory.total"))
        if "memory.used" in cells:
            gpu["used_mib"] = _mib(cells.pop("memory.used"))
        if "memory.free" in cells:
            gpu["free_mib"] = _mib(cells.pop("memory.free"))
        gpus.append(cast(SmiGpu, gpu | cells))  # other fields queried (compute_cap, ...) as printed
    return gpus


def _rocm_gpu(name: str, total: str | None, used: str | None) -> SmiGpu:
    gpu: SmiGpu = {"name": name}
    if total is not None:
        gpu["total_mib"] = round(int(total) / MiB, 2)
    if used is not None:
        gpu["used_mib"] = round(int(used) / MiB, 2)
    if total is not None and used is not None:
        gpu["free_mib"] = round((int(total) - int(used)) / MiB, 2)
    return gpu


_ROCM_SMI = re.compile(r"(GPU\[\d+\])\s*:\s*VRAM Total (Used )?Memory \(B\):\s*(\d+)")


def rocm_smi(text: str) -> list[SmiGpu]:
    """rocm-smi --showmeminfo vram, as text, --csv or --json: per GPU its name (the card series where shown, else
    GPU[n]) and total, used and free MiB."""
    stripped = text.strip()
    if stripped.startswith("{"):
        cards = json.loads(stripped[: stripped.rfind("}") + 1])
        total, used = "VRAM Total Memory (B)", "VRAM Total Used Memory (B)"
        return [
            _rocm_gpu(c.get("Card Series", card), c.get(total), c.get(used))
            for card, c in cards.items()
            if isinstance(c, dict)
        ]
    header = next((line for line in stripped.splitlines() if line.startswith("device,")), None)
    if header:
        rows = csv.DictReader(io.StringIO(stripped[stripped.index(header) :]))
        return [
            _rocm_gpu(
                r.get("Card Series") or r["device"], r.get("VRAM Total Memory (B)"), r.get("VRAM Total Used Memory (B)")
            )
            for r in rows
        ]
    memory: dict[str, dict[str, str]] = {}
    for m in _ROCM_SMI.finditer(text):
        memory.setdefault(m[1], {})["used" if m[2] else "total"] = m[3]
    return [_rocm_gpu(name, v.get("total"), v.get("used")) for name, v in memory.items()]
