"""Speculative decoding's buffers as planned (model/draft.py) against the pinned llama-server's own log, on the
emulated device: a draft twin (-md, --spec-type draft-simple) beside a tiny MoE twin, and a tiny qwen35moe twin's
own MTP head (--spec-type draft-mtp). The main model's and the draft's weights, the main context's KV (with MTP, its
recurrent state's rollback snapshots) and the draft context's KV equal the plan's to the 0.01 MiB llama.cpp prints;
each compute buffer is at most llama.cpp's own reserve of it (llama-fit-params, whose logits are a whole batch's),
our estimate printed beside it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from llamacpp_helpers import manifest
from test_recommend_llamacpp import PRINTED, MiB, a_plan_between, binary, planned, serve_one_completion

from moeplace.core.errors import MoeplaceError
from moeplace.model.draft import draft_need, read_speculative
from moeplace.model.kvcache import pad
from moeplace.model.memory import SERVER, Workload, device_need
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.runtime.allocation import reserve
from moeplace.runtime.device import rpc_device
from moeplace.runtime.llama_log import Load, read_log

pytestmark = [pytest.mark.llamacpp, pytest.mark.untimed]
_RESERVED = re.compile(r"sched_reserve: RPC0\S* compute buffer size =\s+([\d.]+) MiB")
CTX = 2048
MODELS = ROOT / "config/models"


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("twins")
    names = ("tiny-qwen3moe", "tiny-draft", "tiny-qwen35moe")
    return {n: str(write_twin(load_spec(MODELS / f"{n}.yaml"), folder / f"{n}.gguf", "random")) for n in names}


def contexts_of(log: str, cells: int) -> list:
    """(load, context) of every context of `cells` cells the log created, in order (the draft's comes last)."""
    return [(load, c) for load in read_log(log).loads for c in load.contexts if c.n_ctx == cells]


def device_of(buffers) -> dict[str, int]:
    ((_, kinds),) = buffers.devices.items()  # one device: the emulated card
    return kinds


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("draft-simple", []),
        ("draft-simple", ["-ctkd", "q8_0", "-ctvd", "q8_0", "-fa", "on", "--spec-draft-n-max", "5"]),
        ("draft-mtp", []),
    ],
    ids=["draft", "draft-q8_0", "mtp"],
)
def test_the_draft_s_buffers_are_the_plan_s(twins, tmp_path, kind, extra):
    model = twins["tiny-qwen35moe" if kind == "draft-mtp" else "tiny-qwen3moe"]
    draft = twins["tiny-draft"] if kind == "draft-simple" else None
    kv = ("q8_0", "q8_0") if "-ctkd" in extra else ("f16", "f16")
    n_max = int(extra[extra.index("--spec-draft-n-max") + 1]) if "--spec-draft-n-max" in extra else 3
    meta = inspect_model(model)
    spec = read_speculative(kind, model, draft, n_max, kv)
    w = Workload(CTX, flash_attn="on" if "-fa" in extra else "auto", outputs=SERVER)
    n = meta.n_layer // 2
    main = device_need(meta, spec.main(meta, w), n)
    ours = draft_need(spec, meta, w, n)
    line = ["-m", model, "-c", str(CTX), "-ngl", "99", "--n-cpu-moe", str(n), "--parallel", "1"]
    line += [*w.llama_args()[4:6], *spec.llama_args(draft), *extra[:4]]
    with rpc_device(manifest(), 2**34, (0,), tmp_path / "rpc.log") as rpc:
        argv = [binary("llama-server"), *line, "--rpc", rpc, "-v", "-t", "1"]
        answer = serve_one_completion(argv, tmp_path / "server.log")
        reserved = None
        if draft:
            args = Workload(CTX, flash_attn=w.flash_attn, type_k=kv[0], type_v=kv[1]).llama_args()
            reserved = reserve(manifest(), draft, args, 0, rpc, tmp_path / "reserve.log").only_device()["compute"]
    assert answer["tokens_predicted"] == 1
    log = (tmp_path / "server.log").read_text()
    found = contexts_of(log, pad(CTX))
    assert len(found) >= 2, (shlex.join(argv), log[-3000:])
    (main_load, main_ctx), (draft_load, draft_ctx) = found[-2], found[-1]
    logged_main, logged_draft = device_of(Load(main_load.weights, [main_ctx]).last()), device_of(draft_ctx)
    print(f"{kind} {extra}: main {main}, draft {ours}; logged {logged_main}, {logged_draft}", file=sys.stderr)
    if draft:  # the draft is a second load: its own weights
        assert draft_load is not main_load
        assert device_of(draft_load.weights)["weights"] / MiB == pytest.approx(ours.weights / MiB, abs=PRINTED)
        assert logged_main["weights"] / MiB == pytest.approx(main.weights / MiB, abs=PRINTED)
        assert logged_draft["compute"] <= reserved + PRINTED * MiB, (logged_draft, reserved)
    else:  # the MTP head's weights are the main model's, loaded for draft-mtp only
        assert draft_load is main_load
        assert logged_main["weights"] / MiB == pytest.approx((main.weights + ours.weights) / MiB, abs=PRINTED)
        # the MTP context reserves its graph again once drafting is set up: its buffer is the last reserve's (the
        # log reader sums the two lines); no llama.cpp tool reserves an MTP context alone, so ours is the estimate
        logged_draft["compute"] = round(float(_RESERVED.findall(log)[-1]) * MiB)
        assert logged_draft["compute"] <= ours.compute
    assert logged_main["kv"] / MiB == pytest.approx(main.kv / MiB, abs=PRINTED)
    assert logged_draft["kv"] / MiB == pytest.approx(ours.kv / MiB, abs=PRINTED)
    print(f"compute: main logged {logged_main['compute'] / MiB:.2f} MiB, ours {main.compute / MiB:.2f}; draft logged "
          f"{logged_draft['compute'] / MiB:.2f} MiB, ours {ours.compute / MiB:.2f}", file=sys.stderr)  # fmt: skip


def test_llama_server_refuses_the_draft_moeplace_refuses(twins, tmp_path):
    """A draft whose vocabulary differs (tiny-qwen35moe's 512 tokens against tiny-qwen3moe's 4096): moeplace says
    so in one line; the pinned llama-server loads it, then refuses to speculate with it ("failed to initialize
    speculative decoding context") and serves without it: the draft's memory for nothing."""
    with pytest.raises(MoeplaceError, match="vocabulary") as e:
        read_speculative("draft-simple", twins["tiny-qwen3moe"], twins["tiny-qwen35moe"])
    assert "\n" not in str(e.value)
    argv = [binary("llama-server"), "-m", twins["tiny-qwen3moe"], "-md", twins["tiny-qwen35moe"], "--spec-type",
            "draft-simple", "-c", "512", "-t", "1", "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while server.poll() is None and "listening" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=60)
    text = log.read_text()
    assert "vocabs are not compatible" in text and "failed to initialize speculative decoding" in text, text[-3000:]


def test_the_printed_line_with_a_draft_loads_as_planned(twins, tmp_path):
    """recommend -md with llama.cpp's own reserves (--reserve), on an emulated card of the size that leaves about half
    the experts on the host with the draft beside them: the printed llama-server line loads both on a card capped to
    exactly that size and serves, with the buffers the plan counted."""
    model, draft = twins["tiny-qwen3moe"], twins["tiny-draft"]
    meta = inspect_model(model)
    spec = read_speculative(None, model, draft)
    beside = draft_need(spec, meta, Workload(CTX, outputs=SERVER), 0).total
    cap = a_plan_between(Path(model), meta, [], tmp_path) + beside
    plan, text = planned(Path(model), "--vram", f"{cap}B", "--ctx", str(CTX), "-md", draft)
    line = next(s.strip() for s in text.splitlines() if s.strip().startswith("llama-server "))
    assert f"-md {draft} -ngld all --spec-type draft-simple" in line and plan["spec_type"] == "draft-simple"
    with rpc_device(manifest(), cap, (0,), tmp_path / "rpc.log") as rpc:
        argv = [binary("llama-server"), *shlex.split(line)[1:], "--rpc", rpc, "-v", "-t", "1"]
        assert serve_one_completion(argv, tmp_path / "server.log")["tokens_predicted"] == 1
    log = (tmp_path / "server.log").read_text()
    (main_load, main_ctx), (draft_load, draft_ctx) = contexts_of(log, plan["cells"])[-2:]
    logged = device_of(Load(main_load.weights, [main_ctx]).last())
    print(f"printed line: plan {dict((k, plan[k]) for k in plan if k.endswith('_bytes'))}; logged {logged}, draft "
          f"{device_of(draft_load.weights)}, {device_of(draft_ctx)}", file=sys.stderr)  # fmt: skip
    assert logged["weights"] / MiB == pytest.approx(plan["weights_bytes"] / MiB, abs=PRINTED)
    assert logged["kv"] / MiB == pytest.approx(plan["kv_bytes"] / MiB, abs=PRINTED)
    assert logged["compute"] <= plan["compute_bytes"] + PRINTED * MiB
    drafted = device_of(draft_load.weights)["weights"]
    assert drafted / MiB == pytest.approx(plan["draft_weights_bytes"] / MiB, abs=PRINTED)
    assert device_of(draft_ctx)["kv"] / MiB == pytest.approx(plan["draft_kv_bytes"] / MiB, abs=PRINTED)
    assert device_of(draft_ctx)["compute"] <= plan["draft_compute_bytes"] + PRINTED * MiB
