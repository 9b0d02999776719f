"""Where models compute (`device=`, `--device`), and what leaves the device (tiny models, CPU).

No test here needs a GPU: CUDA is made absent (or, for the name resolution alone, present) by
monkeypatching torch.cuda, and input placement is checked on torch's "meta" device, where tensors
have a device but no data.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import wanspec
from wanspec.bench import sweep
from wanspec.bench.config import CONFIGS
from wanspec.bench.context import Context
from wanspec.bench.registry import get_experiment
from wanspec.cli import main
from wanspec.jobs import Forward, TreeForward
from wanspec.models import lm as lm_module
from wanspec.models.invariant import _visible_bias
from wanspec.models.jobs import run_job, run_jobs_batched, session_executor
from wanspec.models.lm import HFLanguageModel, load_model, resolve_device
from wanspec.net.client import load_edge

ENV = {"WANSPEC_THREADS": "1"}
META = torch.device("meta")
PROMPT_IDS = (5, 17, 42, 8, 99, 23, 61)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without CUDA, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every `load_model` call; each call then fails with "spied"
    (a ValueError, which every command shows as a one-line error), so nothing loads."""
    calls: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs)
        raise ValueError("spied")

    monkeypatch.setattr(lm_module, "load_model", spy)
    return calls


@pytest.fixture(scope="module")
def bf16_lm(tiny_pair_shared: tuple[Path, Path]) -> HFLanguageModel:
    return load_model(tiny_pair_shared[1], dtype=torch.bfloat16, threads=1)


# ============================================================================ naming a device


@pytest.mark.parametrize("name", [None, "cpu", "cpu:0", torch.device("cpu")])
def test_cpu_in_any_spelling_is_the_cpu(name: Any) -> None:
    assert resolve_device(name) == torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "says"),
    [("cuda", "'cuda' is not available"), ("cuda:1", "'cuda:1' is not available"),
     ("tpu", "unknown device 'tpu'"), ("garbage", "unknown device 'garbage'"),
     ("", "unknown device ''"), ("meta", "unsupported device 'meta'"),
     ("xla", "unsupported device 'xla'")],
)  # fmt: skip
def test_a_device_this_machine_lacks_is_one_clear_error(
    no_cuda: None, name: str, says: str
) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        resolve_device(name)
    assert "available here: cpu" in str(refused.value)


def test_cuda_names_resolve_against_the_gpus_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)  # the current one
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"2 CUDA GPU\(s\), cuda:0\.\.cuda:1 \(available here: "
                       r"cpu, cuda:0, cuda:1"):  # fmt: skip
        resolve_device("cuda:2")


def test_loading_checks_the_device_before_reading_anything(
    no_cuda: None, tmp_path: Path, tiny_pair_shared: tuple[Path, Path]
) -> None:
    """The device is refused before the folder is even looked at (no FileNotFoundError), and
    `load_pair` refuses before loading either model."""
    with pytest.raises(ValueError, match="'cuda' is not available"):
        load_model(tmp_path / "no-such-model", device="cuda")
    draft, target = tiny_pair_shared
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        wanspec.load_pair(target, draft, device="tpu", threads=1)


def test_an_already_loaded_model_is_not_silently_left_elsewhere(
    no_cuda: None, tiny_pair_shared: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    draft, target = tiny_pair_shared
    draft_lm, target_lm = load_model(draft, threads=1), load_model(target, threads=1)
    pair = wanspec.load_pair(target_lm, draft_lm, device="cpu")
    assert pair.target is target_lm and pair.target.device == torch.device("cpu")
    monkeypatch.setattr(lm_module, "available_devices", lambda: ["cpu", "mps"])
    with pytest.raises(ValueError, match="already loaded on cpu"):
        wanspec.load_pair(target_lm, draft_lm, device="mps")
    with pytest.raises(ValueError, match="already loaded on cpu"):
        load_edge(draft_lm, "x", "127.0.0.1:1", device="mps")  # before any connection


def test_load_edge_loads_a_named_draft_on_the_device_asked(
    tiny_pair_shared: tuple[Path, Path], loads: list[dict[str, Any]]
) -> None:
    with pytest.raises(ValueError, match="spied"):  # before the tokenizer "x" or any connection
        load_edge(str(tiny_pair_shared[0]), "x", "127.0.0.1:1", device="cpu:0", threads=1)
    assert loads[0]["device"] == "cpu:0" and loads[0]["dtype"] == torch.float32


# ============================================================================ the commands


def _commands(tiny_pair_shared: tuple[Path, Path]) -> dict[str, list[str]]:
    draft, target = (str(p) for p in tiny_pair_shared)
    return {
        "generate": ["generate", "--target", target, "--draft", draft, "--prompt", "hi",
                     "--max-new-tokens", "2"],
        "generate --server": ["generate", "--server", "127.0.0.1:1", "--target", target,
                              "--draft", draft, "--prompt", "hi"],
        "serve": ["serve", "--target", target, "--draft-tokenizer", draft, "--port", "0"],
        "edge": ["edge", "--server", "127.0.0.1:1", "--draft", draft, "--target", target],
        "demo": ["demo", "--target", target, "--draft", draft, "--max-new-tokens", "2"],
        "bench": ["bench", "xcosd-bits", "--config", "tiny", "--no-progress"],
    }  # fmt: skip


COMMANDS = ("generate", "generate --server", "serve", "edge", "demo", "bench")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("device", "says"), [("cuda", "'cuda' is not available"), ("tpu", "unknown device 'tpu'")]
)
def test_every_command_refuses_an_absent_device_before_loading(
    no_cuda: None,
    tiny_pair_shared: tuple[Path, Path],
    loads: list[dict[str, Any]],
    command: str,
    device: str,
    says: str,
) -> None:
    args = [*_commands(tiny_pair_shared)[command], "--device", device]
    result = CliRunner().invoke(main, args, env=ENV)
    assert result.exit_code == 2, result.output  # a usage error, not a traceback
    assert "Invalid value for '--device'" in result.output
    assert says in result.output and "available here: cpu" in result.output
    assert loads == []


@pytest.mark.parametrize("command", COMMANDS[:-1])
def test_every_command_loads_on_the_device_asked(
    tiny_pair_shared: tuple[Path, Path], loads: list[dict[str, Any]], command: str
) -> None:
    """The CPU spelt "cpu:0", unlike the default "cpu": a command that drops --device (and
    loads with its default) is caught."""
    args = [*_commands(tiny_pair_shared)[command], "--device", "cpu:0", "--dtype", "bfloat16"]
    result = CliRunner().invoke(main, args, env=ENV)
    assert result.exit_code == 1 and "spied" in result.output, result.output
    assert loads and loads[0]["device"] == "cpu:0" and loads[0]["dtype"] == torch.bfloat16


def test_bench_takes_dtype_and_device_into_its_configuration(
    monkeypatch: pytest.MonkeyPatch, tiny_pair_shared: tuple[Path, Path]
) -> None:
    seen: list[Any] = []

    def spy(name: str, config: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(config)
        raise ValueError("spied")

    monkeypatch.setattr(sweep, "run_experiment", spy)
    args = [*_commands(tiny_pair_shared)["bench"], "--device", "cpu:0", "--dtype", "bfloat16"]
    result = CliRunner().invoke(main, args, env=ENV)
    assert result.exit_code == 1 and "spied" in result.output, result.output
    assert (seen[0].dtype, seen[0].device, seen[0].invariant) == ("bfloat16", "cpu:0", None)
    assert seen[0].loading() == {"dtype": torch.bfloat16, "invariant": None, "device": "cpu:0"}


def test_bench_cells_change_only_when_the_loading_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """A default run keeps its cells' hashes (finished results stay valid); another dtype or
    device computes other logits, so its cells are other cells; the pairs load as configured."""
    monkeypatch.setattr(wanspec, "load_pair", lambda *a, **k: ("pair", a, k))
    base = CONFIGS["tiny"]
    experiment = get_experiment("xcosd-bits")
    cells = experiment.cells(base, Context())
    assert [c.hash for c in sweep.with_loading(cells, base)] == [c.hash for c in cells]
    for change in ({"dtype": "bfloat16"}, {"device": "cuda:1"}, {"invariant": True}):
        moved = sweep.with_loading(cells, dataclasses.replace(base, **change))
        assert all(c.settings["loading"] == change for c in moved)
        assert not {c.hash for c in moved} & {c.hash for c in cells}
    ctx = Context(threads=1, loading=dataclasses.replace(base, device="cuda:1").loading())
    _, _, kwargs = ctx.pair("qwen2.5-coder-0.5b", "smollm2-135m")
    assert kwargs == {"threads": 1, "dtype": torch.float32, "invariant": None, "device": "cuda:1"}


def test_serve_loads_its_target_in_the_dtype_and_on_the_device_asked(
    tiny_pair_shared: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    served, calls = [], []
    real = lm_module.load_model

    def spy(*args: Any, **kwargs: Any) -> HFLanguageModel:
        calls.append(kwargs)
        return real(*args, **kwargs)

    async def start_then_stop(server: Any, ready: Any) -> None:
        async with server:
            ready(server)
            served.append(server)

    monkeypatch.setattr(lm_module, "load_model", spy)
    monkeypatch.setattr("wanspec.net.service.serve_until_signalled", start_then_stop)
    args = [*_commands(tiny_pair_shared)["serve"], "--dtype", "float16", "--device", "cpu:0"]
    result = CliRunner().invoke(main, args, env=ENV)
    assert result.exit_code == 0, result.output
    target = served[0].target
    assert (target.dtype, target.device) == (torch.float16, torch.device("cpu"))
    assert calls[0]["device"] == "cpu:0"
    assert "model: float16, pass-shape invariant kernels on cpu" in result.output


# ============================================================================ what crosses


def test_device_cpu_generates_what_transformers_generate_does(
    tiny_pair_shared: tuple[Path, Path],
) -> None:
    """Greedy through every kind of job (chains, verification, trees and kept paths) equals
    transformers' own greedy `generate` of the target, on an explicit device="cpu"."""
    draft, target = tiny_pair_shared
    pair = wanspec.load_pair(target, draft, threads=1, device="cpu")
    assert pair.target.device == pair.draft.device == torch.device("cpu")
    prompt = "hello world"
    ids = torch.tensor([pair.target_encode(prompt)])
    ref = pair.target.model.generate(
        ids, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(ids)
    )[0, ids.shape[1] :].tolist()
    for method in ("ar", "sd", "acespec"):
        res = wanspec.generate(pair, prompt, method, temperature=0, max_new_tokens=10, gamma=3)
        assert res.token_ids == ref, method


def test_the_executor_hands_over_float32_cpu_rows_of_their_own(bf16_lm: HFLanguageModel) -> None:
    """Whatever the model's dtype: float32 CPU tensors, only the rows asked for, each owning
    its storage (no view that keeps a whole pass's logits alive)."""
    execute = session_executor(bf16_lm)
    width = bf16_lm.vocab_size
    prefill = execute(Forward(0, PROMPT_IDS, rows=1)).block
    verify = execute(Forward(len(PROMPT_IDS), (3, 4, 5), rows=3)).block
    tree = execute(TreeForward((6, 7, 8), (-1, 0, 0))).block
    for logits, rows in ((prefill, 1), (verify, 3), (tree, 3)):
        assert (logits.dtype, logits.device, logits.shape) == (
            torch.float32,
            torch.device("cpu"),
            (rows, width),
        )
        assert logits.untyped_storage().nbytes() == rows * width * 4
    whole = bf16_lm.new_session().extend(PROMPT_IDS)
    assert whole.dtype == torch.float32 and torch.equal(prefill, whole[-1:])


def test_extend_returns_exactly_the_last_rows_asked(bf16_lm: HFLanguageModel) -> None:
    session = bf16_lm.new_session()
    whole = session.prefill(PROMPT_IDS)
    assert torch.equal(session.prefill(PROMPT_IDS, rows=3), whole[-3:])
    assert session.prefill(PROMPT_IDS, rows=0).shape == (0, bf16_lm.vocab_size)
    assert session.length == len(PROMPT_IDS)  # rows choose what returns, not what is cached
    for bad in (-1, len(PROMPT_IDS) + 1, True, 1.0):
        with pytest.raises(ValueError, match="rows must be an int"):
            session.extend([1], rows=bad)


def test_a_batched_pass_returns_each_sessions_rows_as_alone(bf16_lm: HFLanguageModel) -> None:
    """In bf16 (invariant) the rows of a batched pass equal each session's alone, bit for bit,
    float32 on the CPU, only the rows each job asked for."""
    jobs = [Forward(0, PROMPT_IDS, rows=1), Forward(0, PROMPT_IDS[:4], rows=4)]
    alone = [run_job(bf16_lm.new_session(), job).block for job in jobs]
    batched = [r.block for r in run_jobs_batched([(bf16_lm.new_session(), j) for j in jobs])]
    for a, b, job in zip(alone, batched, jobs, strict=True):
        assert b.dtype == torch.float32 and b.device.type == "cpu"
        assert b.shape == (job.rows, bf16_lm.vocab_size) and torch.equal(a, b)
    with pytest.raises(ValueError, match="row counts"):
        HFLanguageModel.extend_batch(
            [bf16_lm.new_session(), bf16_lm.new_session()], [[1], [2]], [1]
        )


class _Recorder:
    """Stands in for a transformers model: records what a pass is given, answers zeros."""

    def __init__(self, width: int) -> None:
        self.width, self.calls = width, []

    def __call__(self, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(kwargs)
        batch, n = kwargs["input_ids"].shape
        return SimpleNamespace(logits=torch.zeros((batch, n, self.width)))


def _devices(call: dict[str, Any]) -> set[str]:
    mask = call["attention_mask"]
    masks = list(mask.values()) if isinstance(mask, dict) else [mask]
    tensors = [call["input_ids"], call["position_ids"], *[m for m in masks if m is not None]]
    return {t.device.type for t in tensors}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_pass_builds_its_inputs_on_the_models_device(
    tiny_models: dict[str, Path], family: str
) -> None:
    """With the model's device set to "meta", every input a chain, a tree or a batched pass
    gives the model (ids, positions, masks: one per layer type for gemma3) is made there."""
    lm = load_model(tiny_models[family], threads=1)
    lm.device, lm.model = META, _Recorder(lm.vocab_size)
    session = lm.new_session()
    session.extend([1, 2, 3], rows=1)
    session.tree_forward([4, 5], [-1, 0])
    session.truncate(3)
    HFLanguageModel.extend_batch([session, lm.new_session()], [[6], [7, 8]], [1, 2])
    calls = lm.model.calls
    assert len(calls) == 3 and calls[1]["attention_mask"] is not None
    assert [_devices(call) for call in calls] == [{"meta"}] * 3
    assert _visible_bias(None, 2, 5, META).device == META  # invariant attention's causal mask
