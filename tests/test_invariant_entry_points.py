"""Pass-shape-invariant mode from every entry point (tiny models).

`load_model` decides it once: `invariant=None` means on for a 16-bit dtype, off for float32, and
a 16-bit dtype with `invariant=False` is refused (the exactness contract's pass-shape clause).
Each command that loads a model (`wanspec serve`, `generate` local and `--server`, `edge`,
`demo`) has --dtype and --invariant/--no-invariant, and the models it really loads (spied at
`load_model`, and the served target inside the server) run in the mode asked for; a refusal is a
clean one-line error before anything is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import wanspec
from wanspec.cli import main
from wanspec.models import lm as lm_module
from wanspec.models.invariant import InvariantLinear, is_batch_invariant
from wanspec.models.lm import HFLanguageModel, load_model
from wanspec.models.registry import load_tokenizer
from wanspec.net.background import BackgroundLoop
from wanspec.net.server import CloudServer, build_target_info

ENV = {"WANSPEC_THREADS": "1"}
REFUSED = "pass-shape-invariant mode"


def mode(lm: HFLanguageModel) -> tuple[torch.dtype, bool]:
    return lm.dtype, is_batch_invariant(lm.model)


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[HFLanguageModel]:
    """Every model `load_model` returns during the test, in order (the entry points import it
    when they run, so they get this spy)."""
    real, models = lm_module.load_model, []

    def spy(*args: Any, **kwargs: Any) -> HFLanguageModel:
        models.append(real(*args, **kwargs))
        return models[-1]

    monkeypatch.setattr(lm_module, "load_model", spy)
    return models


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What `wanspec serve` and `wanspec edge` would serve, started and stopped at once (a
    CloudServer) or only recorded (an EdgeService) instead of served until a signal."""
    services: list[Any] = []

    async def start_then_stop(server: CloudServer, ready: Any) -> None:
        async with server:
            ready(server)
            services.append(server)

    monkeypatch.setattr("wanspec.net.service.serve_until_signalled", start_then_stop)
    monkeypatch.setattr("wanspec.edge_service.cli._serve", lambda edge, *_: services.append(edge))
    return services


@pytest.fixture(scope="module")
def cloud(tiny_pair_hetero: tuple[Path, Path]) -> Iterator[str]:
    """A bf16 (hence invariant) tiny target served in-process; its "HOST:PORT"."""
    draft, target = tiny_pair_hetero
    target_lm = load_model(target, dtype=torch.bfloat16, threads=1)
    info = build_target_info(target_lm, [load_tokenizer(draft)])
    with BackgroundLoop() as bg:
        server = CloudServer(target_lm, info, host="127.0.0.1", port=0)
        bg.run(server.start())
        try:
            yield "{}:{}".format(*server.address)
        finally:
            bg.run(server.stop())


def test_a_16_bit_model_is_invariant_unless_refused_float32_only_when_asked(
    tiny_models: dict[str, Path], tiny_pair_shared: tuple[Path, Path]
) -> None:
    folder = tiny_models["qwen2"]
    assert mode(load_model(folder, threads=1)) == (torch.float32, False)
    assert mode(load_model(folder, threads=1, invariant=True)) == (torch.float32, True)
    for dtype in (torch.bfloat16, torch.float16):
        assert mode(load_model(folder, dtype=dtype, threads=1)) == (dtype, True)
        assert mode(load_model(folder, dtype=dtype, threads=1, invariant=True)) == (dtype, True)
        with pytest.raises(ValueError, match=REFUSED) as refused:
            load_model(folder, dtype=dtype, threads=1, invariant=False)
        assert "exactness contract" in str(refused.value)
    draft, target = tiny_pair_shared
    pair = wanspec.load_pair(target=target, draft=draft, dtype=torch.bfloat16, threads=1)
    assert mode(pair.target) == mode(pair.draft) == (torch.bfloat16, True)
    with pytest.raises(ValueError, match=REFUSED):
        wanspec.load_pair(target, draft, dtype=torch.bfloat16, threads=1, invariant=False)


def test_is_batch_invariant_needs_the_attention_and_every_linear(
    tiny_models: dict[str, Path],
) -> None:
    lm = load_model(tiny_models["llama"], dtype=torch.bfloat16, threads=1)
    assert is_batch_invariant(lm.model)
    first = next(m for m in lm.model.modules() if isinstance(m, InvariantLinear))
    first.__class__ = torch.nn.Linear
    assert not is_batch_invariant(lm.model)
    assert not is_batch_invariant(load_model(tiny_models["llama"], threads=1).model)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([], (torch.float32, False)), (["--invariant"], (torch.float32, True)),
     (["--dtype", "bfloat16"], (torch.bfloat16, True))],
)  # fmt: skip
def test_serve_loads_its_target_in_the_mode_asked(
    tiny_pair_hetero: tuple[Path, Path],
    served: list[Any],
    flags: list[str],
    expected: tuple[torch.dtype, bool],
) -> None:
    draft, target = tiny_pair_hetero
    args = ["serve", "--target", str(target), "--draft-tokenizer", str(draft), "--port", "0"]
    result = CliRunner().invoke(main, [*args, *flags], env=ENV)
    assert result.exit_code == 0, result.output
    target_lm = served[0].target
    assert mode(target_lm) == expected
    linears = [m for m in target_lm.model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(isinstance(m, InvariantLinear) for m in linears) == expected[1]
    kernels = "pass-shape invariant" if expected[1] else "default"
    assert f"model: {str(expected[0]).removeprefix('torch.')}, {kernels} kernels" in result.output


def test_generate_loads_both_models_in_the_mode_asked(
    tiny_pair_hetero: tuple[Path, Path], loaded: list[HFLanguageModel]
) -> None:
    draft, target = tiny_pair_hetero
    args = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "hello",
            "--max-new-tokens", "3", "--temperature", "0", "--json"]  # fmt: skip
    bf16 = CliRunner().invoke(main, [*args, "--dtype", "bfloat16"], env=ENV)
    assert bf16.exit_code == 0, bf16.output
    assert [mode(lm) for lm in loaded] == [(torch.bfloat16, True)] * 2
    loaded.clear()
    fp32 = CliRunner().invoke(main, [*args, "--invariant"], env=ENV)
    assert fp32.exit_code == 0, fp32.output
    assert [mode(lm) for lm in loaded] == [(torch.float32, True)] * 2


def test_generate_remote_loads_its_draft_in_the_mode_asked(
    cloud: str, tiny_pair_hetero: tuple[Path, Path], loaded: list[HFLanguageModel]
) -> None:
    """The draft is loaded in bf16 (so invariant) and the run matches the same bf16 pair's
    simulated run: with both sides invariant, greedy tokens do not depend on the transport."""
    draft, target = tiny_pair_hetero
    args = ["generate", "--server", cloud, "--target", str(target), "--draft", str(draft),
            "--prompt", "hello world", "--method", "xcosd-e", "--max-new-tokens", "8",
            "--temperature", "0", "--json", "--dtype", "bfloat16"]  # fmt: skip
    result = CliRunner().invoke(main, args, env=ENV)
    assert result.exit_code == 0, result.output
    assert [mode(lm) for lm in loaded] == [(torch.bfloat16, True)]
    pair = wanspec.load_pair(target, draft, dtype=torch.bfloat16, threads=1)
    local = wanspec.generate(pair, "hello world", "xcosd-e", max_new_tokens=8, temperature=0)
    assert json.loads(result.output)["token_ids"] == local.token_ids


def test_edge_loads_its_draft_in_the_mode_asked(
    cloud: str,
    tiny_pair_hetero: tuple[Path, Path],
    loaded: list[HFLanguageModel],
    served: list[Any],
) -> None:
    draft, target = tiny_pair_hetero
    args = ["edge", "--server", cloud, "--draft", str(draft), "--target", str(target)]
    result = CliRunner().invoke(main, [*args, "--dtype", "float16"], env=ENV)
    assert result.exit_code == 0, result.output
    assert mode(served[0].edge.draft) == (torch.float16, True)
    assert loaded == [served[0].edge.draft]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(["--invariant"], (torch.float32, True)), (["--dtype", "bfloat16"], (torch.bfloat16, True))],
)
def test_demo_loads_both_models_in_the_mode_asked(
    tiny_pair_shared: tuple[Path, Path],
    loaded: list[HFLanguageModel],
    flags: list[str],
    expected: tuple[torch.dtype, bool],
) -> None:
    draft, target = tiny_pair_shared
    args = ["demo", "--target", str(target), "--draft", str(draft), "--methods", "ar,sd",
            "--max-new-tokens", "4", "--prompt", "hello", "--no-shared-win"]  # fmt: skip
    result = CliRunner().invoke(main, [*args, *flags], env=ENV)
    assert result.exit_code == 0, result.output
    assert [mode(lm) for lm in loaded] == [expected] * 2
    assert "greedy text" in result.output and not any(
        line.rstrip().endswith("NO") for line in result.output.splitlines()
    )


@pytest.mark.parametrize(
    "command",
    [["serve", "--port", "0"], ["generate", "--prompt", "x", "--max-new-tokens", "2"],
     ["generate", "--prompt", "x", "--server", "127.0.0.1:9"], ["edge", "--server", "127.0.0.1:9"],
     ["demo", "--methods", "ar", "--max-new-tokens", "2"]],
    ids=["serve", "generate", "generate-remote", "edge", "demo"],
)  # fmt: skip
def test_every_command_refuses_a_16_bit_dtype_without_invariance_cleanly(
    tiny_pair_shared: tuple[Path, Path],
    loaded: list[HFLanguageModel],
    served: list[Any],
    command: list[str],
) -> None:
    draft, target = tiny_pair_shared
    models = ["--target", str(target)] + (["--draft", str(draft)] if command[0] != "serve" else [])
    flags = ["--dtype", "bfloat16", "--no-invariant"]
    result = CliRunner().invoke(main, [*command, *models, *flags], env=ENV)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.startswith("Error: bfloat16 models run only in " + REFUSED)
    assert "exactness contract" in result.output and "Traceback" not in result.output
    assert loaded == served == []  # refused before anything was loaded or served
