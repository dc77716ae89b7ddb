"""Models where users keep them: Ollama's store, LM Studio's folder, the Hugging Face cache, and header-only
reads over HTTP (a local range server stands in for the Hub)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from cli_helpers import moeplace as run_here
from conftest import ROOT, Q, write_gguf

from moeplace.model.meta import from_json
from moeplace.model.twin import load_spec, write_twin


def moeplace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The command in this process, in this environment with `env` over it."""
    return run_here(*args, env={**os.environ, "PATH": "/usr/bin:/bin", **(env or {})})  # no ollama binary to ask


def inspect_json(ref: str, env: dict[str, str] | None = None) -> dict:
    out = moeplace("inspect", ref, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def ollama_store(root: Path, model: Path, *name: str, tag: str = "latest") -> None:
    """What `ollama pull` leaves: a manifest naming the model layer's digest, and the blob."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    shutil.copy(model, root / "blobs" / f"sha256-{digest}")
    manifest = root.joinpath("manifests", *name, tag)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))


def test_ollama_name_reads_the_same_model_as_its_blob(tmp_path, small_moe):
    root = tmp_path / "ollama"
    ollama_store(root, small_moe, "registry.ollama.ai", "library", "tiny", tag="q4")
    ollama_store(root, small_moe, "hf.co", "someone", "Tiny-GGUF", tag="Q4_K_M")
    env = {"OLLAMA_MODELS": str(root)}
    blob = next((root / "blobs").glob("sha256-*"))
    assert inspect_json("ollama:tiny:q4", env) == inspect_json(str(blob))
    assert inspect_json("ollama:hf.co/someone/Tiny-GGUF:Q4_K_M", env)["expert_bytes"] > 0
    missing = moeplace("inspect", "ollama:tiny", env=env)  # tag latest was never pulled
    assert missing.returncode == 2 and "no manifest at" in missing.stderr and "ollama list" in missing.stderr
    # A Modelfile for Ollama: its own name in FROM; no ollama binary here to ask its version.
    text = moeplace("recommend", "ollama:tiny:q4", "--vram", "1GiB", "--ctx", "4096", "--emit", "ollama", env=env)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("FROM tiny:q4\nPARAMETER num_ctx 4096\n") and "no ollama found here" in text.stdout
    assert "#   LLAMA_ARG_N_CPU_MOE=0 ollama serve" in text.stdout


def test_lmstudio_and_hf_cache_references(tmp_path, small_moe):
    lms = tmp_path / "lmstudio"
    (lms / "pub/Tiny-GGUF").mkdir(parents=True)
    for name in ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-f16.gguf"):
        shutil.copy(small_moe, lms / "pub/Tiny-GGUF" / name)
    env = {"LMSTUDIO_MODELS": str(lms)}
    several = moeplace("inspect", "lmstudio:pub/Tiny-GGUF", env=env)
    assert several.returncode == 2 and "matches 2 models" in several.stderr and "mmproj" not in several.stderr
    one = inspect_json("lmstudio:pub/Tiny-GGUF/tiny-Q8_0.gguf", env)
    assert one["files"][0]["path"] == str(lms / "pub/Tiny-GGUF/tiny-Q8_0.gguf")

    hub = tmp_path / "hub"
    snapshot = hub / "models--org--Tiny-GGUF/snapshots/0123abcd"
    snapshot.mkdir(parents=True)
    shutil.copy(small_moe, snapshot / "tiny-Q4_K_M.gguf")
    cached = inspect_json("hf:org/Tiny-GGUF", {"HF_HUB_CACHE": str(hub), "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert cached["files"][0]["path"] == str(snapshot / "tiny-Q4_K_M.gguf")  # from the cache, not the network


class RangeServer(http.server.ThreadingHTTPServer):
    """Serves files from a folder with Range support, counting the bytes it sends; /api/models/... lists them."""

    def __init__(self, folder: Path, ranges: bool = True):
        self.folder, self.ranges, self.sent = folder, ranges, 0
        super().__init__(("127.0.0.1", 0), RangeHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RangeHandler(http.server.BaseHTTPRequestHandler):
    server: RangeServer

    def log_message(self, *args) -> None:  # noqa: ANN002 - quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/api/models/"):
            names = sorted(p.name for p in self.server.folder.glob("*.gguf"))
            body = json.dumps({"siblings": [{"rfilename": n} for n in names]}).encode()
            return self._send(200, body, {"Content-Type": "application/json"})
        path = self.server.folder / self.path.rsplit("/", 1)[-1]
        if not path.is_file():
            return self._send(404, b"not found")
        size = path.stat().st_size
        spec = self.headers.get("Range", "")
        if not self.server.ranges or not spec.startswith("bytes="):
            return self._send(200, b"", {"Content-Length": str(size)})  # would stream the whole file
        start, end = (int(x) for x in spec[6:].split("-"))
        end = min(end, size - 1)
        with path.open("rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.server.sent += len(body)
        self._send(206, body, {"Content-Range": f"bytes {start}-{end}/{size}"})

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for key, value in (headers or {"Content-Length": str(len(body))}).items():
            self.send_header(key, value)
        if headers and "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def big_twin(tmp_path_factory) -> Path:
    """Qwen3-Coder-30B-A3B as a header-only twin: 18.5 GB on paper, sparse on disk."""
    folder = tmp_path_factory.mktemp("served")
    return write_twin(load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml"), folder / "qwen3-coder-Q4_K_M.gguf")


def test_remote_header_reads_a_fraction_of_the_file(big_twin):
    server = RangeServer(big_twin.parent)
    try:
        local = inspect_json(str(big_twin))
        remote = inspect_json(f"{server.url}/org/repo/resolve/main/{big_twin.name}")
        assert {k: v for k, v in remote.items() if k != "files"} == {k: v for k, v in local.items() if k != "files"}
        assert [f["header_sha256"] for f in remote["files"]] == [f["header_sha256"] for f in local["files"]]
        size = big_twin.stat().st_size
        assert server.sent < min(0.01 * size, 16 * 2**20), server.sent
        # hf: that is not cached asks the Hub (here the stand-in) which files the repo has, then reads one header.
        env = {"HF_HUB_CACHE": str(big_twin.parent / "empty"), "HF_ENDPOINT": server.url}
        plan = moeplace("recommend", "hf:org/repo", "--vram", "16GB", "--ctx", "32768", "--json", env=env)
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)[0]["n_cpu_moe"] > 0
        text = moeplace("inspect", "hf:org/repo", env=env).stdout
        assert "over HTTP (the header only)" in text
    finally:
        server.shutdown()


def test_remote_split_model_reads_every_shards_header(tmp_path):
    keys = {"block_count": 1, "embedding_length": 256, "attention.head_count": 4, "expert_count": 4,
            "expert_used_count": 2}  # fmt: skip
    split = {"split.count": 2, "split.tensors.count": 3}
    write_gguf(tmp_path / "m-00001-of-00002.gguf", "qwen3moe", keys,
               [("token_embd.weight", (256, 10), Q.F16), ("blk.0.attn_k.weight", (256, 64), Q.F16)],
               {"split.no": 0, **split})  # fmt: skip
    experts = [("blk.0.ffn_up_exps.weight", (256, 256, 4), Q.Q4_K)]
    write_gguf(tmp_path / "m-00002-of-00002.gguf", "qwen3moe", {}, experts, {"split.no": 1, **split})
    server = RangeServer(tmp_path)
    try:
        meta = from_json(inspect_json(f"{server.url}/m-00002-of-00002.gguf"))
        assert meta.expert_bytes == 256 * 4 * 144 and len(meta.files) == 2
    finally:
        server.shutdown()


def test_remote_failures_are_one_clear_line(small_moe, tmp_path):
    shutil.copy(small_moe, tmp_path / "m.gguf")
    server = RangeServer(tmp_path, ranges=False)
    try:
        no_ranges = moeplace("inspect", f"{server.url}/m.gguf")
        assert no_ranges.returncode == 2 and "does not answer range requests" in no_ranges.stderr
        missing = moeplace("inspect", f"{server.url}/nope.gguf")
        assert "HTTP 404" in missing.stderr
    finally:
        server.shutdown()
    offline = moeplace("inspect", "http://127.0.0.1:9/m.gguf")
    assert offline.returncode == 2 and "are you offline?" in offline.stderr
    assert "Traceback" not in no_ranges.stderr + missing.stderr + offline.stderr
    tune = moeplace("tune", "http://127.0.0.1:9/m.gguf", "--ctx", "4096", "--vram", "1GB")
    assert tune.returncode == 2 and "download it first" in tune.stderr


def test_emit_bench_and_llama_swap(small_moe):
    bench = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "4096", "--emit", "bench").stdout
    assert bench.startswith("llama-bench -m ") and "-d 3584 -p 512 -n 128" in bench and "-ncmoe 0" in bench
    swap = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "4096", "--emit", "llama-swap").stdout
    assert swap.startswith('models:\n  "') and 'cmd: "llama-server --port ${PORT} -m ' in swap and "-c 4096" in swap


def test_a_models_name_is_a_short_line_and_quoted_in_llama_swap():
    """general.name goes into commands and configs: a name that is no line of text gives way to the file's name,
    and a quote in a good one stays inside llama-swap's YAML key."""
    from types import SimpleNamespace

    import yaml

    from moeplace.model.metadata import model_name
    from moeplace.plan.commands import llama_swap

    def named(name):
        return model_name(SimpleNamespace(metadata={"general.name": name}, paths=[Path("/m/model-Q4.gguf")]))

    assert named('Qwen3 "Coder"') == 'Qwen3 "Coder"'
    assert named("x\n  evil: 1") == named("n" * 129) == named(None) == "model-Q4"
    entry = yaml.safe_load(llama_swap({'Qwen3 "Coder": v2-32k': "llama-server -m m.gguf"}))
    assert list(entry["models"]) == ['Qwen3 "Coder": v2-32k']


def test_the_config_takes_a_store_reference(tmp_path, small_moe, monkeypatch):
    import yaml
    from workflow_helpers import snakemake, workflow_copy

    default = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    ollama_store(tmp_path / "ollama", small_moe, "registry.ollama.ai", "library", "tiny", tag="q4")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    wd = workflow_copy(tmp_path / "wd", {**default, "models": {"mine": {"gguf": "ollama:tiny:q4"}}})
    run = snakemake(wd, "results/metadata/mine.json")
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((wd / "results/metadata/mine.json").read_text())["files"][0]["path"].startswith(
        str(tmp_path / "ollama/blobs/sha256-")
    )
    wd = workflow_copy(tmp_path / "remote", {**default, "models": {"mine": {"gguf": "https://example.org/m.gguf"}}})
    run = snakemake(wd, "-n", "results/metadata/mine.json")
    assert run.returncode != 0 and "moeplace: config models.mine.gguf: https://example.org/m.gguf is not on this" in (
        run.stderr
    )


@pytest.mark.parametrize(("version", "route"), [("0.30.1", "ollama serve"), ("0.12.6", "runs its own engine")])
def test_ollama_modelfile_follows_your_ollamas_version(tmp_path, small_moe, version, route):
    """Ollama 0.30.0 and newer run llama-server with their environment; older ones have no route but llama.cpp's."""
    fake = tmp_path / "bin/ollama"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho 'ollama version is {version}'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    text = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "4096", "--emit", "ollama", env=env).stdout
    assert route in text and "PARAMETER num_cpu_moe" not in text  # `ollama create` refuses unknown parameters
    assert ("LLAMA_ARG_N_CPU_MOE=0 ollama serve" in text) == (version == "0.30.1")
    assert ("yours is 0.30.1" in text) == (version == "0.30.1")
