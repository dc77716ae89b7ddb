"""Where a user's model is: a path, or a name in the store of the runner that downloaded it.

- a path (any shard of a split model) or an http(s) URL of a .gguf (read header-only);
- ollama:NAME[:TAG]: Ollama's manifest -> its model blob ($OLLAMA_MODELS, else ~/.ollama/models);
- lmstudio:PUBLISHER/REPO[/FILE]: LM Studio's models folder ($LMSTUDIO_MODELS, ~/.lmstudio/models,
  ~/.cache/lm-studio/models);
- hf:ORG/REPO[/FILE.gguf]: the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub),
  else the Hub itself ($HF_ENDPOINT), header only.
A reference that matches several models lists them; one that matches none says where it looked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.parse
from pathlib import Path

from ..core.errors import MoeplaceError
from .process import run
from .remote import get_json

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
STORES = ("ollama:", "lmstudio:", "hf:")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def is_remote(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def resolve(ref: str) -> str:
    """A local path or an http(s) URL for `ref`; MoeplaceError says what to give instead."""
    scheme, sep, rest = ref.partition(":")
    if sep and scheme == "ollama":
        return str(ollama_blob(rest))
    if sep and scheme == "lmstudio":
        return str(_one(lmstudio_files(rest), f"lmstudio:{rest}"))
    if sep and scheme == "hf":
        return hf_file(rest)
    if is_remote(ref):
        return ref
    if not Path(ref).exists():
        raise MoeplaceError(
            f"{ref}: no such file; give a .gguf path, ollama:NAME, lmstudio:PUBLISHER/REPO or hf:ORG/REPO."
        )
    return ref


def resolve_local(ref: str) -> str:
    """A runner-store reference as a local path (a plain path as given); a model that is only remote fails:
    whatever runs the model needs its file."""
    if not ref.startswith(STORES) and not is_remote(ref):
        return ref
    path = resolve(ref)
    if is_remote(path):
        raise MoeplaceError(f"{ref} is not on this machine; running it needs the file: download it and give its path.")
    return path


def _home(env: str, *defaults: str) -> list[Path]:
    if os.environ.get(env):
        return [Path(os.environ[env]).expanduser()]
    return [Path(d).expanduser() for d in defaults]


def ollama_blob(name: str) -> Path:
    """The GGUF blob of an Ollama model: NAME[:TAG], NAMESPACE/NAME or REGISTRY/NAMESPACE/NAME (hf.co/...)."""
    (root,) = _home("OLLAMA_MODELS", "~/.ollama/models")
    model, _, tag = name.partition(":")
    parts = model.split("/")
    if not model or len(parts) > 3:
        raise MoeplaceError(f"ollama:{name}: write it as NAME[:TAG], e.g. ollama:qwen3:30b-a3b.")
    if len(parts) == 1:  # a library model of Ollama's own registry
        parts = ["registry.ollama.ai", "library", *parts]
    elif len(parts) == 2:  # NAMESPACE/NAME there
        parts = ["registry.ollama.ai", *parts]
    manifest = root.joinpath("manifests", *parts, tag or "latest")
    if not manifest.is_file():
        raise MoeplaceError(
            f"ollama:{name}: no manifest at {manifest}; is the model pulled (ollama list), or OLLAMA_MODELS set?"
        )
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
        digest: str = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
        raise MoeplaceError(f"ollama:{name}: {manifest} lists no model layer; re-pull the model.") from None
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise MoeplaceError(f"ollama:{name}: its blob {blob} is missing; re-pull the model.")
    return blob


def _first_shard(path: Path) -> bool:
    """A whole model, or the first shard of a split one."""
    m = _SHARD.search(path.name)
    return not m or m[1] == "00001"


def _models_in(folder: Path) -> list[Path]:
    """The .gguf models under a folder: a split model counts once (its first shard), projectors not at all."""
    return sorted(p for p in folder.rglob("*.gguf") if not p.name.startswith("mmproj") and _first_shard(p))


def _one(found: list[Path], ref: str) -> Path:
    if len(found) == 1:
        return found[0]
    names = ", ".join(str(p) for p in found[:8]) + (" …" if len(found) > 8 else "")
    raise MoeplaceError(f"{ref} matches {len(found)} models: {names}; name one, e.g. {ref}/{found[0].name}.")


def lmstudio_files(rest: str) -> list[Path]:
    parts = rest.strip("/").split("/")
    if len(parts) < 2:
        raise MoeplaceError(f"lmstudio:{rest}: write it as PUBLISHER/REPO[/FILE], as LM Studio's models folder does.")
    roots = _home("LMSTUDIO_MODELS", "~/.lmstudio/models", "~/.cache/lm-studio/models")
    for root in roots:
        folder = root.joinpath(*parts[:2])
        if folder.is_dir():
            found = _models_in(folder)
            if len(parts) > 2:
                wanted = "/".join(parts[2:])
                found = [p for p in found if p.name == wanted or p.name.startswith(wanted) or wanted in str(p)]
            if found:
                return found
    raise MoeplaceError(
        f"lmstudio:{rest}: no .gguf under {' or '.join(str(r.joinpath(*parts[:2])) for r in roots)}; "
        "is it downloaded, or LMSTUDIO_MODELS set?"
    )


def hf_file(rest: str) -> str:
    """hf:ORG/REPO[/FILE]: the cached file if there is one, else its URL on the Hub (read header-only)."""
    parts = rest.strip("/").split("/")
    if len(parts) < 2:
        raise MoeplaceError(f"hf:{rest}: write it as ORG/REPO[/FILE.gguf].")
    repo, wanted = "/".join(parts[:2]), "/".join(parts[2:])
    (hub,) = _home("HF_HUB_CACHE", os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub"))
    snapshots = hub / f"models--{repo.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir():
        newest: dict[str, Path] = {}  # a file kept by several revisions: the newest one
        for path in sorted(_models_in(snapshots), key=lambda p: p.stat().st_mtime):
            newest["/".join(path.relative_to(snapshots).parts[1:])] = path
        found = [p for name, p in newest.items() if not wanted or name == wanted or p.name == wanted]
        if found:
            return str(_one(found, f"hf:{repo}"))
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if not wanted:
        wanted = _one_remote(endpoint, repo)
    return f"{endpoint}/{repo}/resolve/main/{urllib.parse.quote(wanted)}"


def _one_remote(endpoint: str, repo: str) -> str:
    """The one .gguf model of a Hub repo (its file list from the Hub's API), or the list to choose from."""
    siblings = [s.get("rfilename", "") for s in get_json(f"{endpoint}/api/models/{repo}").get("siblings", [])]
    models = [Path(f) for f in siblings if f.endswith(".gguf")]
    found = [p for p in models if not p.name.startswith("mmproj") and _first_shard(p)]
    if not found:
        raise MoeplaceError(f"hf:{repo}: not in the cache and the Hub lists no .gguf in it.")
    return str(_one(found, f"hf:{repo}"))


def ollama_version() -> tuple[int, ...] | None:
    """The version of the ollama on PATH (`ollama --version`: "ollama version is 0.30.1"); None: no ollama, or
    one that does not say."""
    exe = shutil.which("ollama")
    if not exe:
        return None
    done = run([exe, "--version"], timeout_s=10)
    m = re.search(r"version is (\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    return tuple(int(x) for x in m.groups()) if m else None
