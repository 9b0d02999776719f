"""`wanspec bench overhead` on the tiny pairs: the phase table resolves and fails loudly when
stale, the wrappers come off, exclusive phases add up to handle(), a planted slow function
shows in its own phase only, and the command writes its JSON."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import wanspec
from wanspec.bench.overhead import (
    COLUMNS,
    DRIVER,
    PHASES,
    PhaseTableError,
    instrument,
    measure,
    resolve,
)
from wanspec.cli import main

SLEEP_S = 0.005


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANSPEC_THREADS", "1")
        yield


@pytest.fixture(scope="module")
def shared(tiny_pair_shared: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_shared
    return wanspec.load_pair(target, draft)


@pytest.fixture(scope="module")
def hetero(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target, draft)


def _bound(objects: list[Any]) -> list[tuple[types.ModuleType, str, Any]]:
    """(module, name, value) of every loaded module's global that is one of `objects`."""
    ids = {id(o) for o in objects}
    return [
        (module, name, value)
        for module in list(sys.modules.values())
        if isinstance(module, types.ModuleType)
        for name, value in list(vars(module).items())
        if id(value) in ids
    ]


def _is_wrapper(value: Any) -> bool:
    kind = type(value)  # not isinstance: some modules hold objects that warn when asked
    inner = value.__func__ if kind is staticmethod or kind is classmethod else value
    return type(inner) is types.FunctionType and "__wanspec_phase__" in vars(inner)


def _generate(pair: wanspec.Pair, method: str, tokens: int = 6) -> Any:
    return wanspec.generate(pair, "hello world", method, max_new_tokens=tokens, seed=0, gamma=3)


# ============================================================================ the table


def test_every_name_of_the_phase_table_resolves_to_a_function() -> None:
    targets = resolve()
    assert [t.name for t in targets] == [n for names in PHASES.values() for n in names]
    for t in targets:
        assert isinstance(t.function, types.FunctionType), t.name
        assert vars(t.owner)[t.attr] is t.raw, t.name  # defined there, not inherited
    assert list(COLUMNS) == [*PHASES, "other", "driver"]


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("wanspec.sampling.warps:gone_away", "gone_away.*no longer exists.*update PHASES"),
        ("wanspec.no_such_module:f", "does not import"),
        ("wanspec.sampling.draws:Nope.method", "no class 'Nope'"),
        ("wanspec.protocols.pipeline:PipelineEdge.count", "inherited"),  # defined on Machine
        ("wanspec.sampling.quant:PROB_SCALE", "not a function"),
        ("wanspec.sampling.quant.sample", "expected 'package.module:function'"),
    ],
)
def test_a_stale_or_malformed_name_fails_loudly(name: str, match: str) -> None:
    with pytest.raises(PhaseTableError, match=match):
        resolve({"warp": [name]})


def test_a_name_listed_twice_or_a_computed_phase_is_refused() -> None:
    twice = {"warp": ["wanspec.sampling.draws:pick"], "sampling": ["wanspec.sampling.draws:pick"]}
    with pytest.raises(PhaseTableError, match="listed twice"):
        resolve(twice)
    with pytest.raises(PhaseTableError, match="computed"):
        resolve({"other": ["wanspec.sampling.draws:pick"]})


def test_a_stale_table_patches_nothing() -> None:
    from wanspec.sampling import quant

    original = quant.quantize
    table = {"rounding": ["wanspec.sampling.quant:quantize", "wanspec.sampling.quant:gone"]}
    with pytest.raises(PhaseTableError), instrument(table):
        pass
    assert quant.quantize is original


# ============================================================================ patching


def test_wrappers_reach_every_binding_and_all_come_off(shared: wanspec.Pair) -> None:
    from wanspec.protocols import speculative
    from wanspec.sampling import draws
    from wanspec.sim import driver
    from wanspec.vocab.alignment import VocabAlignment

    targets = resolve()
    originals = [t.raw for t in targets] + [driver.simulate]
    before = _bound(originals)
    # `from wanspec.sampling import pick` binds pick in the protocol module too
    pick_sites = {m.__name__ for m, _, v in before if v is draws.pick}
    assert {
        "wanspec.sampling.draws",
        "wanspec.sampling",
        "wanspec.protocols.speculative",
    } <= pick_sites
    raw_restrict = vars(VocabAlignment)["project_draft_logits"]
    with pytest.raises(RuntimeError, match="inside"), instrument():
        for module, name, _ in before:
            assert _is_wrapper(vars(module)[name]), f"{module.__name__}.{name}"
        assert _is_wrapper(vars(VocabAlignment)["project_draft_logits"])
        assert _is_wrapper(speculative.pick) and _is_wrapper(wanspec.api.simulate)
        _generate(shared, "xcosd", tokens=2)
        raise RuntimeError("an error inside the block")
    for module, name, value in before:
        assert vars(module)[name] is value, f"{module.__name__}.{name} not restored"
    assert vars(VocabAlignment)["project_draft_logits"] is raw_restrict
    for t in targets:
        assert vars(t.owner)[t.attr] is t.raw, t.name
    left = [
        f"{module.__name__}.{name}"
        for module in list(sys.modules.values())
        if isinstance(module, types.ModuleType)
        for name, value in list(vars(module).items())
        if _is_wrapper(value)
    ]
    assert left == []


# ============================================================================ the numbers


@pytest.fixture(scope="module")
def report(shared: wanspec.Pair) -> Any:
    return measure(shared, ["xcosd", "acespec"], prompts=2, tokens=8, gamma=3, decodes=3)


def test_exclusive_phases_add_up_to_each_sides_handle_time(report: Any) -> None:
    assert [m.method for m in report.methods] == ["xcosd", "acespec"]
    assert report.target_decode_ms > 0 and report.draft_step_ms > 0
    for m in report.methods:
        assert m.rounds > 0 and 0 < m.tokens <= 16 and m.prompts == 2
        for side in ("edge", "cloud"):
            phases = m.phases_s[side]
            assert set(phases) == set(COLUMNS)
            assert all(s >= -1e-12 for s in phases.values()), (m.method, side, phases)
            assert phases[DRIVER] == 0.0
            assert sum(phases.values()) == pytest.approx(m.handle_s[side], rel=1e-9, abs=1e-12)
            assert phases["warp"] > 0 and phases["sampling"] > 0 and phases["other"] > 0
        driver = m.phases_s[DRIVER]
        assert all(s >= -1e-12 for s in driver.values()) and driver["other"] == 0.0
        own = m.simulate_s - sum(m.handle_s.values()) - sum(m.executor_s.values())
        assert m.side_s(DRIVER) == pytest.approx(own, rel=1e-9, abs=1e-12)
        assert driver["codec"] > 0  # every message is encoded and decoded by the simulator
        assert m.executor_s["edge"] > 0 and m.executor_s["cloud"] > 0
    xcosd, acespec = report.methods
    assert acespec.phases_s["edge"]["tree ranking"] > 0  # the tree's alternatives
    assert xcosd.phases_s["edge"]["tree ranking"] == 0.0
    assert acespec.calls["edge"]["sampling"] > xcosd.calls["edge"]["sampling"]  # keyed streams


def test_json_rows_are_the_seconds_per_round(report: Any) -> None:
    out = report.to_json()
    xcosd = out["methods"]["xcosd"]
    m = report.methods[0]
    edge = xcosd["sides"]["edge"]
    assert edge["ms_per_round"] == pytest.approx(1e3 * m.handle_s["edge"] / m.rounds)
    assert edge["x_target_decode"] == pytest.approx(edge["ms_per_round"] / report.target_decode_ms)
    assert sum(edge["phases_ms_per_round"].values()) == pytest.approx(edge["ms_per_round"])
    both = m.handle_s["edge"] + m.handle_s["cloud"] + m.phases_s[DRIVER]["codec"]
    assert xcosd["both_sides_ms_per_round"] == pytest.approx(1e3 * both / m.rounds)


@pytest.mark.parametrize(
    ("owner_name", "attr", "phase"),
    [
        ("wanspec.sampling.quant", "quantize", "rounding"),
        ("wanspec.sampling.proposal:DraftRow", "draw", "sampling"),
    ],
)
def test_a_planted_slow_function_shows_in_its_phase_only(
    hetero: wanspec.Pair, monkeypatch: pytest.MonkeyPatch, owner_name: str, attr: str, phase: str
) -> None:
    module_name, _, class_name = owner_name.partition(":")
    owner = sys.modules[module_name]
    owner = getattr(owner, class_name) if class_name else owner
    original = vars(owner)[attr]
    slept = [0]
    state: dict[str, Any] = {}
    # The plant's sleep per call is sized from this machine's own run without it: at least three
    # calls then outweigh any phase six times over, however slow or loaded the machine is.
    with instrument() as plain:
        _generate(hetero, "xcosd")
    busiest = max(s for side in ("edge", "cloud", DRIVER) for s in plain.side_phases(side).values())
    sleep_s = max(SLEEP_S, 2 * busiest)

    def slow(*args: Any, **kwargs: Any) -> Any:
        if state["clock"].active:
            slept[0] += 1
            time.sleep(sleep_s)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attr, slow)
    if not class_name:  # every `from … import` binding of it, as a profiler would meet it
        for module, name, _ in _bound([original]):
            monkeypatch.setattr(module, name, slow)
    with instrument() as clock:
        state["clock"] = clock
        _generate(hetero, "xcosd")
    planted = slept[0] * sleep_s
    assert slept[0] >= 3
    columns = {
        (side, c): s
        for side in ("edge", "cloud", DRIVER)
        for c, s in clock.side_phases(side).items()
    }
    assert sum(s for (_, c), s in columns.items() if c == phase) >= planted
    elsewhere = {key: s for key, s in columns.items() if key[1] != phase}
    assert max(elsewhere.values()) < planted / 2, elsewhere


# ============================================================================ the command


def test_the_command_prints_the_table_and_writes_json(
    tiny_pair_hetero: tuple[Path, Path], tmp_path: Path
) -> None:
    draft, target = tiny_pair_hetero
    out = tmp_path / "overhead.json"
    args = ["bench", "overhead", "--draft", str(draft), "--target", str(target)]
    args += ["--methods", "xcosd-e,acespec", "--prompts", "1", "--tokens", "4"]
    args += ["--decodes", "2", "--json", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "target decode (1 token, prompt cached):" in result.output
    assert "skipped acespec: needs one tokenizer on both sides" in result.output
    header = next(line for line in result.output.splitlines() if line.startswith("method"))
    assert header.split()[:5] == ["method", "side", "rounds", "ms/round", "×decode"]
    data = json.loads(out.read_text())
    assert set(data) == {
        "pair",
        "settings",
        "reference",
        "phase_table",
        "columns",
        "methods",
        "skipped",
    }
    assert data["pair"] == {"draft": str(draft), "target": str(target)}
    assert data["settings"]["gamma"] == 4 and data["settings"]["temperature"] == 1.0
    assert data["reference"]["target_decode_ms"] > 0 and data["reference"]["draft_step_ms"] > 0
    assert list(data["methods"]) == ["xcosd-e"] and list(data["skipped"]) == ["acespec"]
    method = data["methods"]["xcosd-e"]
    assert method["rounds"] > 0 and 0 < method["tokens"] <= 4
    assert set(method["sides"]) == {"edge", "cloud", "driver"}
    for side in method["sides"].values():
        assert list(side["phases_ms_per_round"]) == data["columns"] == list(COLUMNS)
        assert {"ms_per_round", "x_target_decode", "total_s"} <= set(side)
    assert method["both_sides_x_target_decode"] > 0
