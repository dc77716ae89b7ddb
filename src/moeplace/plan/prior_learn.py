"""Learn a speed prior from what users publish: how sweeps from many machines are pooled.

A prior is learned from points (learned_prior.Point: a setup's machine, the speed model's features of a run and its
measured tok/s). The shipped prior (learned_prior.json) is learned from the shipped points (published_points.json,
written by tools/speed_prior.py from tools/published/, each row's source in SOURCES.md). `moeplace prior learn
DIR... -o prior.json` pools those with the runs of moeplace publish/ directories (llama-bench.sqlite, one row per
run, and MANIFEST.json) and learns the same terms the same way; `recommend`/`predict --prior prior.json` use them.

A published directory says its card (llama-bench's gpu_info, whose datasheet cards.py knows) and backend; its host
RAM bandwidth it says in MANIFEST.json's optional "machine" section, else the command's --bw-ddr (a datasheet figure)
or --bw-ddr-measured (a measured one): a learned host term means nothing without it. Each directory is one source:
the left-out scores leave all its setups out together.
"""

from __future__ import annotations

import json
import math
import sqlite3
import tempfile
from pathlib import Path
from typing import TypedDict, cast

import numpy as np

from ..core.backends import PRIOR_NAMES
from ..core.errors import MoeplaceError
from ..core.records import JsonObject, Row
from ..model.meta import ModelMeta
from ..model.metadata import inspect_model
from ..model.twin import load_spec, write_twin
from .cards import datasheet
from .learned_prior import (
    Learned,
    Machine,
    Point,
    held_out_errors,
    learn,
    load,
    point_features,
    source_of,
    to_json,
)
from .machine import DEFAULT_LINK_GBPS
from .speed import Run

POINTS_FILE = Path(__file__).with_name("published_points.json")  # written by tools/speed_prior.py
DIGITS = 4  # coefficients as stored: a solver's last digits differ between machines
MANIFEST, SQLITE = "MANIFEST.json", "llama-bench.sqlite"  # a publish/ directory's, as report.publish names them


class MachineFacts(TypedDict, total=False):
    """What a published directory's machine is, as its MANIFEST.json's machine section or the flags say."""

    backend: str | None
    card_gbps: float
    host_gbps: float
    link_gbps: float
    card_tflops: float
    host_measured: bool  # host_gbps is a measured read (STREAM, membw), not the datasheet's


MACHINE_KEYS = tuple(MachineFacts.__annotations__)


def rounded(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


# --- points, stored ------------------------------------------------------------------------------


def points_json(points: list[Point]) -> str:
    rows = [
        {
            "setup": p.setup,
            "source": p.source,
            "test": p.test,
            "machine": p.machine.__dict__,
            "x": {k: float(f"{v:.6g}") for k, v in p.x.items()},
            "tok_s": float(f"{p.tok_s:.6g}"),
            "family": p.family,
            "run": p.run,
        }
        for p in points
    ]
    return "[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in rows) + "\n]\n"


def load_points(path: Path = POINTS_FILE) -> list[Point]:
    try:
        rows = json.loads(Path(path).read_text())
        return [
            Point(
                r["setup"],
                r["test"],
                Machine(**r["machine"]),
                r["x"],
                r["tok_s"],
                r["source"],
                r.get("family", ""),
                r.get("run", {}),
            )
            for r in rows
        ]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise MoeplaceError(
            f"{path}: not moeplace's stored published points ({e}); rewrite it with python tools/speed_prior.py."
        ) from None


# --- learning ------------------------------------------------------------------------------------


def learn_prior(points: list[Point]) -> tuple[dict[str, Learned], dict[str, list[tuple[Point, float]]]]:
    """The prior from `points`, each test's terms learned from all of them and its spreads from each source left
    out in turn; with those left-out errors (log(predicted / measured) per point)."""
    held = {t: held_out_errors(t, points) for t in ("tg", "pp") if sum(p.test == t for p in points)}
    prior = {}
    for test, errors in held.items():
        if len({source_of(p) for p, _ in errors}) < 2:
            raise MoeplaceError(f"{test}: points of one source only; a prior's spread needs at least two sources.")
        p = learn(test, points, errors)
        p.coef = {k: rounded(v) for k, v in p.coef.items()}
        p.per_backend = {k: rounded(v) for k, v in p.per_backend.items()}
        p.log_q95 = rounded(p.log_q95)
        p.log_q_ratio = {q: [rounded(v) for v in values] for q, values in p.log_q_ratio.items()}
        prior[test] = p
    if "tg" not in prior:
        raise MoeplaceError("no decode (tg) points: a prior needs llama-bench tg runs.")
    return prior, held


def about(points: list[Point], learned_from: list[str]) -> JsonObject:
    tests = sorted({p.test for p in points}, reverse=True)
    return {
        "learned_from": learned_from,
        "setups": {t: len({p.setup for p in points if p.test == t}) for t in tests},
        "sources": {t: len({source_of(p) for p in points if p.test == t}) for t in tests},
        "written_by": "moeplace prior learn (the shipped prior: tools/speed_prior.py)",
    }


def load_prior(path: str | Path | None) -> dict[str, Learned] | None:
    """--prior's file (None: the shipped prior), with one line naming the file where it is not a prior."""
    return None if path is None else load(Path(path))


# --- published directories -----------------------------------------------------------------------


def _meta(
    name: str, row: Row, models: dict[str, str], tmp: Path, cache: dict[str, ModelMeta | None]
) -> ModelMeta | None:
    """The model of a published row: --model NAME=PATH (a .gguf, or a twin spec .yaml), else the file the run read
    where it is still at hand; None where neither."""
    path = models.get(name) or str(row.get("model_filename") or "")
    if path in cache:
        return cache[path]
    meta = None
    if path.endswith((".yaml", ".yml")):
        meta = inspect_model(write_twin(load_spec(path), tmp / (Path(path).stem + ".gguf"), "none"))
    elif path and Path(path).exists():
        meta = inspect_model(path)
    cache[path] = meta
    return meta


def _machine(folder: Path, row: Row, given: MachineFacts) -> Machine:
    card = str(row.get("gpu_info") or "")
    sheet = datasheet(card) if card else None
    facts: MachineFacts = {"backend": PRIOR_NAMES.get(str(row.get("backends") or "").split(",")[0].strip().lower())}
    if sheet:
        facts |= {"card_gbps": sheet.gbps, "card_tflops": sheet.tflops}
    facts |= {"link_gbps": DEFAULT_LINK_GBPS, "host_measured": False}
    facts |= given
    missing = [k for k in MACHINE_KEYS if facts.get(k) is None]
    if missing:
        raise MoeplaceError(
            f"{folder}: {', '.join(missing)} not known for the card {card or '(none named)'}; say it in "
            f'MANIFEST.json\'s "machine" section or with --bw-ddr/--bw-ddr-measured, --bw-vram, --card-tflops, '
            "--backend."
        )
    backend = facts["backend"]
    assert backend is not None  # one of MACHINE_KEYS: known, or refused above
    return Machine(
        backend,
        float(facts["card_gbps"]),
        float(facts["host_gbps"]),
        float(facts["link_gbps"]),
        float(facts["card_tflops"]),
        bool(facts["host_measured"]),
    )


def measured_runs(path: Path) -> list[Row]:
    """The measured runs of a published llama-bench.sqlite (its llama_bench table, as report.publish writes it)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        rows = [dict(r) for r in con.execute("SELECT * FROM llama_bench")]
        con.close()
    except sqlite3.Error as e:
        raise MoeplaceError(f"{path}: not a llama-bench SQLite table ({e}); publish the results again.") from None
    return rows


RunKey = tuple[str, str, str, int, int, str, str, int, int, Machine, float]


def _run_key(row: Row, setup: str, test: str, size: int, meta: ModelMeta, machine: Machine) -> RunKey:
    """What makes a published row the same point as another: repeats of it are averaged."""
    n = min(int(row.get("n_cpu_moe") or 0), meta.n_layer)
    kv = (str(row.get("type_k")), str(row.get("type_v")))
    model, ubatch, depth = str(row.get("model")), int(row.get("n_ubatch") or 512), int(row.get("n_depth") or 0)
    return (setup, model, test, size, ubatch, *kv, n, depth, machine, float(row.get("model_size") or 0))


def directory_points(folder: Path, models: dict[str, str], flags: MachineFacts, tmp: Path) -> list[Point]:
    """The runs of one published directory as points: measured rows of --n-cpu-moe placements (-ot and layer
    splits left out), repeats of a point averaged; one source."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MoeplaceError(f"{folder}: no readable {MANIFEST} ({e}); is this a moeplace publish/ directory?") from None
    if not (folder / SQLITE).exists():
        raise MoeplaceError(f"{folder}: no {SQLITE}; publish the results again with moeplace's publish stage.")
    # MANIFEST.json's machine section, read as the facts it names
    given = cast(MachineFacts, {k: v for k, v in (manifest.get("machine") or {}).items() if k in MACHINE_KEYS}) | flags
    name = manifest.get("name") or folder.name
    source = f"{name} ({', '.join(manifest.get('hosts') or [])})"
    cache: dict[str, ModelMeta | None] = {}
    metas: dict[str, ModelMeta] = {}
    runs: dict[RunKey, list[float]] = {}
    for row in measured_runs(folder / SQLITE):
        if (avg_ts := row.get("avg_ts")) is None or (row.get("tensor_buft_overrides") or "none") != "none":
            continue
        meta = _meta(str(row.get("model")), row, models, tmp, cache)
        if meta is None:
            continue
        metas[str(row.get("model"))] = meta
        ngl = int(row.get("n_gpu_layers") or 99)
        if ngl < meta.n_layer:  # a layer split: not a --n-cpu-moe placement
            continue
        test = "pp" if int(row.get("n_prompt") or 0) > 0 else "tg"
        tokens = row["n_prompt"] if test == "pp" else row["n_gen"]
        assert tokens is not None  # a measured row's
        size = int(tokens)
        machine = _machine(folder, row, given)
        setup = f"{name}/{row.get('model')}/{row.get('gpu_info')}/{row.get('type_k')}-{row.get('type_v')}"
        runs.setdefault(_run_key(row, setup, test, size, meta, machine), []).append(float(avg_ts))
    if not runs:
        raise MoeplaceError(
            f"{folder}: no measured --n-cpu-moe runs of a model at hand; give each model's file as "
            "--model NAME=PATH (a .gguf or a twin spec .yaml)."
        )
    points = []
    for (setup, model, test, size, ubatch, type_k, type_v, n, depth, machine, file_bytes), speeds in runs.items():
        meta = metas[model]
        scale = file_bytes / meta.total_bytes if file_bytes > 0 else 1.0
        x = point_features(meta, Run(n, depth, test, size, ubatch, type_k, type_v))
        x = {k: v * scale if k in ("device_gb", "host_gb", "link_gb", "active_gb") else v for k, v in x.items()}
        run: dict[str, int | str] = {"n_cpu_moe": n, "depth": depth, "size": size, "ubatch": ubatch}
        run |= {"type_k": type_k, "type_v": type_v}
        family = setup.rsplit("/", 1)[0]  # the setup less its KV cache type: one machine's runs of one model
        points.append(Point(setup, test, machine, x, float(np.mean(speeds)), source, family, run))
    return points


def learn_from_directories(
    folders: list[str], models: dict[str, str], flags: MachineFacts, shipped: bool, output: str
) -> list[str]:
    """Pool published directories' sweeps (with the shipped points unless not `shipped`), learn a prior, write it to
    `output`; what it learned from and how well, in lines: each directory's points, and the learned prior's
    left-out errors per test."""
    points = load_points() if shipped else []
    said = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder in folders:
            found = directory_points(Path(folder), models, flags, Path(tmp))
            said.append(f"{folder}: {len(found)} points, {len({p.setup for p in found})} setups")
            points += found
    prior, held = learn_prior(points)
    learned_from = ([str(POINTS_FILE.name)] if shipped else []) + list(folders)
    Path(output).write_text(to_json(prior, about(points, learned_from)))
    for test, errors in held.items():
        e = np.abs([x for _, x in errors])
        sources = len({source_of(p) for p, _ in errors})
        said.append(
            f"{test}: {len({p.setup for p, _ in errors})} setups from {sources} sources; each source left out: "
            f"median error {100 * math.expm1(float(np.median(e))):.0f}%, ~95% interval "
            f"x{math.exp(prior[test].log_q95):.2f}; a ratio of two placements of one machine, by its size "
            f"(x1-1.11, -1.28, -1.65, beyond): ~90% x/÷"
            + ", ".join(f"{math.exp(q):.2f}" for q in prior[test].log_q_ratio["90"])
        )
    return said
