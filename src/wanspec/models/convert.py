"""GGUF → Hugging Face folder conversion, done once per model and cached.

Loading a GGUF through transformers dequantizes every tensor in Python (tens of seconds); a
saved safetensors folder then loads in about a second. Every folder is built in a temp
directory beside its final place and renamed in, so a crash never leaves a half-written model.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub are imported

import importlib.util
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "ConversionError",
    "build_dir_atomically",
    "convert_gguf",
    "convert_gguf_tokenizer",
    "estimate_hf_bytes",
]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ConversionError(RuntimeError):
    """A GGUF file could not be turned into a Hugging Face folder."""


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPE_BYTES:
        raise ConversionError(f"unsupported dtype {name!r}; use one of {sorted(DTYPE_BYTES)}")
    return getattr(torch, name)


def estimate_hf_bytes(gguf: Path, dtype: str) -> int:
    """Size of the dequantized weights in ``dtype``, read from the GGUF header (no tensor data)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    elements = sum(int(t.n_elements) for t in reader.tensors)
    return elements * DTYPE_BYTES[dtype]


def _require_accelerate() -> None:
    # transformers refuses to read GGUF weights without it; say so before a long load.
    if importlib.util.find_spec("accelerate") is None:
        raise ConversionError(
            "converting a GGUF model needs the `accelerate` package: pip install accelerate"
        )


def convert_gguf(
    gguf: Path,
    out_dir: Path,
    dtype: str = "float32",
    tokenizer_from: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Dequantize ``gguf`` into a safetensors model + tokenizer saved in ``out_dir``.

    ``tokenizer_from`` (a tokenizer folder) replaces the tokenizer rebuilt from the GGUF
    metadata, which can lack pieces of the original (Qwen2.5's NFC normalizer) and counts
    padding rows as tokens. Returns a few facts about the result.
    """
    _require_accelerate()
    torch_dtype = _torch_dtype(dtype)
    from transformers import AutoTokenizer

    if tokenizer_from is None:
        tokenizer = convert_gguf_tokenizer(gguf, out_dir)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_from), local_files_only=True)
        tokenizer.save_pretrained(str(out_dir))
    with _transformers_bars(progress):
        model = _load_dequantized(gguf, torch_dtype)
        model.save_pretrained(str(out_dir))
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "embedding_rows": int(model.get_input_embeddings().weight.shape[0]),
        "tokenizer_size": len(tokenizer),
    }


def _load_dequantized(gguf: Path, torch_dtype: torch.dtype) -> Any:
    """The GGUF model as a plain dense transformers model (no GGUF quantizer left attached)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch_dtype,
            quantization_config=GgufConfig(dequantize=True),
            local_files_only=True,
        )
    except Exception as exc:  # transformers raises many types for unreadable files
        raise ConversionError(f"transformers could not load {gguf.name}: {exc}") from exc
    if getattr(model, "hf_quantizer", None) is not None:
        raise ConversionError(f"{gguf.name} was not fully dequantized; cannot save it")
    return model


@contextmanager
def _transformers_bars(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars for a quiet pull, then restore them."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled and not enabled:
            hf_logging.enable_progress_bar()


def convert_gguf_tokenizer(gguf: Path, out_dir: Path) -> Any:
    """Save only the tokenizer embedded in ``gguf`` (seconds, no weights read)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
    except Exception as exc:
        raise ConversionError(f"could not read the tokenizer of {gguf.name}: {exc}") from exc
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build_dir_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` into a fresh temp folder, then rename it to ``final``.

    Readers therefore see a complete folder or none. An existing ``final`` (stale, or just
    built by a concurrent pull of the same model) is swapped out only once ours is complete.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    with _temp_dir(final) as tmp:
        build(tmp)
        for item in tmp.rglob("*"):  # some writers (safetensors) create private files
            item.chmod(0o755 if item.is_dir() else 0o644)
        _swap_in(tmp, final)
    return final


@contextmanager
def _temp_dir(final: Path) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    tmp.chmod(0o755)  # mkdtemp makes it private; a cache is meant to be readable
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, final: Path) -> None:
    old: Path | None = None
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
        os.replace(final, old / final.name)
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():  # a real failure, not another build landing in between
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
