"""The plain records that cross a file: a bench record (results/bench/*.jsonl), one row of an output table, and
a JSON object as a file or a tool holds it. They stay dicts because they go to JSON, CSV and pandas as they are;
what they hold is written here once."""

from __future__ import annotations

from typing import Any, TypeAlias, TypedDict

# A JSON object at a file's or a tool's edge (the raw config before it is typed, a published MANIFEST's facts, a
# stored model or calibration before from_json, an HTTP answer): its keys and nesting are the file's.
JsonObject: TypeAlias = dict[str, Any]


class FileRecord(TypedDict):
    """One model file's identity as a measured record keeps it (model/meta.ModelFile)."""

    path: str
    size: int
    header_sha256: str


class KvContext(TypedDict):
    """One llama.cpp context's KV cache as its -v log gives it."""

    n_ctx: int
    kv_mib: float


# One cell of a CSV table.
Cell: TypeAlias = str | int | float | bool | None
# One row of an output table (results/<stage>/*.csv): column -> cell, as the data dictionary lists the columns.
Row: TypeAlias = dict[str, Cell]


class LlamaBenchRow(TypedDict, total=False):
    """One test as llama-bench prints it (-o json/jsonl; its SQL table's columns, in that order, then the samples).
    Fields a build does not print are absent; a newer build's extra fields are kept as they come."""

    build_commit: str
    build_number: int
    cpu_info: str
    gpu_info: str
    backends: str
    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    cpu_mask: str
    cpu_strict: bool
    poll: int
    type_k: str
    type_v: str
    n_gpu_layers: int
    split_mode: str
    main_gpu: int
    no_kv_offload: bool
    flash_attn: int
    tensor_split: str
    tensor_buft_overrides: str
    load_mode: str
    embeddings: bool
    no_op_offload: bool
    n_prompt: int
    n_gen: int
    n_depth: int
    test_time: str
    avg_ns: int
    stddev_ns: int
    avg_ts: float
    stddev_ts: float | None  # None: a pasted table's row without its ± spread
    n_cpu_moe: int
    fit_target: int
    fit_min_ctx: int
    samples_ns: list[int]
    samples_ts: list[float]


class Provenance(TypedDict, total=False):
    """What ties a measured record to its inputs: the llama.cpp build, the model's files, the host, the revision."""

    llamacpp_version: str | None
    llamacpp_commit: str | None
    llamacpp_build: int | None
    model_files: list[FileRecord]
    started: str
    host: str
    cpu: str
    cores: int | None
    load_avg_1m: float
    gpu_processes: list[str]
    gpus: list[str]
    pipeline_commit: str
    pipeline_dirty: bool | None


class BenchRecord(Provenance, total=False):
    """One test of one configuration as the bench and placement stages write it (a line of their JSONL), with
    everything that ties it to its inputs; a failed test has the same keys, its statistics None."""

    # the configuration
    model: str
    ctx: int
    n_cpu_moe: int
    variant: str  # "ncmoe" for the sweep; an -ot variant's name
    overrides: str  # the -ot value ("" for none)
    tensor_split: str
    n_gpu_layers: int
    n_prompt: int
    n_gen: int
    n_depth: int
    threads: int
    bench_cpus: list[int]
    device_cpus: list[int] | None
    type_k: str
    type_v: str
    ubatch: int
    flash_attn: str
    paired_n_cpu_moe: int | None
    # the device
    device_kind: str
    device: str
    device_cap_bytes: int | None
    device_caps_bytes: list[int]
    host_slowdown: float
    others_running: float | None
    contended: bool | None
    # llama.cpp's own accounting from its -v log (measure/bench_record.parse_log)
    kv_contexts: list[KvContext]
    buffers: dict[str, dict[str, int]] | None  # buffer name -> kind -> bytes, of the largest context
    tensor_buffers: dict[str, str]  # overridden tensor -> its buffer
    cpu_tensors: list[str]
    batches: int  # llama-bench processes the test took (each a batch of repetitions)
    precision_target: float | None
    # the test and its statistics
    test: str  # "tg" or "pp"
    status: str  # "ok", or how it failed
    partial: bool
    median_ts: float | None
    ci95_low_ts: float | None
    ci95_high_ts: float | None
    interval: str
    outlying_ts: list[float]
    avg_ts: float | None
    stddev_ts: float | None
    samples_ts: list[float]
    samples_noise: list[dict[str, float] | None]  # what the machine did to each repetition (runtime/noise.py)
    warmup_ts: list[float]  # repetitions measured but left out as warm-ups (measure/repetitions.warmed_up)
    baseline_samples_ts: list[float]
    repetitions: int
    cv: float | None
    ci95_halfwidth_pct: float | None
    target_reached: bool | None
    noisy: bool | None
    backends: str | None
    gpu_info: str | None
    llama_bench: LlamaBenchRow  # llama-bench's own row of the first batch, its per-sample arrays aside
    error: str
    # an -ot variant's check (measure/placement): the experts it meant for the host, and where llama.cpp put them
    host_expert_bytes: int
    placement_match: bool
    placement_missing: list[str]
    placement_unexpected: list[str]
