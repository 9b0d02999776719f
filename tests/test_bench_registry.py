"""The experiment registry (wanspec.bench.registry): every experiment module's experiments once,
in the documented order; aliases; a name taken twice fails at import; and an experiment module
imported alone changes nothing outside itself (experiments are never registered by import)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from wanspec.bench import registry
from wanspec.bench.experiment import Experiment
from wanspec.bench.registry import ALIASES, EXPERIMENTS, SOURCES, Source, build, get_experiment
from wanspec.cli import main

# docs/BENCHMARKS.md's order, which `wanspec bench list`, its commands and the report follow
DOCUMENTED = {
    "wanspec.bench.xcosd": ["xcosd-bits", "xcosd-rate", "quality", "analysis"],
    "wanspec.bench.acespec": [
        "acespec-table1",
        "acespec-bandwidth",
        "acespec-ablation",
        "acespec-budget",
        "acespec-temperature",
    ],
    "wanspec.bench.capacity": ["capacity", "capacity-real"],
    "wanspec.bench.linksweep": ["link-sweep"],
}
DOCUMENTED_ALIASES = {"ablation": "acespec-ablation"}
BENCH = Path(registry.__file__).parent
NOT_EXPERIMENT_MODULES = {"experiment", "registry"}  # they define or gather, never add


def _held(value: Any) -> list[Experiment]:
    """The experiments a module-level value holds: itself, or a collection's or mapping's items.
    (`_ALONE` repeats this: it runs where this module cannot be imported.)"""
    if isinstance(value, Experiment):
        return [value]
    items = list(value.values()) if isinstance(value, Mapping) else value
    if not isinstance(items, list | tuple | set | frozenset):
        return []
    return [v for v in items if isinstance(v, Experiment)]


def test_the_registry_holds_each_modules_experiments_once_in_the_documented_order() -> None:
    assert [s.module for s in SOURCES] == list(DOCUMENTED)
    for source in SOURCES:
        assert [e.name for e in source.experiments] == DOCUMENTED[source.module]
        assert all(EXPERIMENTS[e.name] is e for e in source.experiments)
    names = [name for names in DOCUMENTED.values() for name in names]
    assert list(EXPERIMENTS) == names
    assert Counter(e.name for s in SOURCES for e in s.experiments) == Counter(set(names))
    assert dict(ALIASES) == DOCUMENTED_ALIASES


def test_every_module_that_defines_experiments_is_a_source() -> None:
    """A new experiment module must be listed in SOURCES, and every experiment a source module
    holds at module level must be in the registry (none left out of its list)."""
    defining = {
        f"wanspec.bench.{p.stem}"
        for p in BENCH.glob("*.py")
        if p.stem not in NOT_EXPERIMENT_MODULES and "Experiment(" in p.read_text(encoding="utf-8")
    }
    assert defining == {s.module for s in SOURCES}
    for module in (sys.modules[s.module] for s in SOURCES):
        for attr, value in vars(module).items():
            for experiment in _held(value):
                assert EXPERIMENTS.get(experiment.name) is experiment, f"{module.__name__}.{attr}"


def test_the_list_command_and_the_commands_follow_the_registry() -> None:
    result = CliRunner().invoke(main, ["bench", "list"])
    assert result.exit_code == 0, result.output
    shown = [line.split()[0] for line in result.output.split("\n\n")[0].splitlines()]
    assert shown == [*EXPERIMENTS, *ALIASES]
    help_text = CliRunner().invoke(main, ["bench", "--help"]).output
    assert all(f"  {name} " in help_text for name in shown)


def test_get_experiment_resolves_aliases_and_refuses_unknown_names() -> None:
    assert all(get_experiment(name) is e for name, e in EXPERIMENTS.items())
    assert get_experiment("ablation") is EXPERIMENTS["acespec-ablation"]
    with pytest.raises(ValueError, match="unknown experiment 'nope'") as err:
        get_experiment("nope")
    assert str(err.value).endswith("known: " + ", ".join(EXPERIMENTS))


def test_the_registry_is_read_only() -> None:
    with pytest.raises(TypeError):
        EXPERIMENTS["extra"] = EXPERIMENTS["analysis"]  # type: ignore[index]
    with pytest.raises(TypeError):
        ALIASES["extra"] = "analysis"  # type: ignore[index]


def _named(name: str) -> Experiment:
    return replace(EXPERIMENTS["analysis"], name=name)


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        (
            [Source("m1", [_named("a")]), Source("m2", [_named("a")])],
            "experiment name 'a' is defined twice (in m1 and m2)",
        ),
        ([Source("m1", [_named("a"), _named("a")])], "'a' is defined twice (in m1)"),
        ([Source("m1", [_named("a")], {"a": "a"})], "'a' is defined twice (in m1)"),
        (
            [Source("m1", [_named("a")], {"b": "a"}), Source("m2", [], {"b": "a"})],
            "'b' is defined twice (in m1 and m2)",
        ),
        ([Source("m1", [_named("a")], {"b": "c"})], "m1: alias 'b' names no experiment ('c')"),
    ],
    ids=["across-modules", "within-a-module", "alias-is-a-name", "alias-twice", "alias-dangles"],
)
def test_build_refuses_a_name_taken_twice_or_a_dangling_alias(
    sources: list[Source], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        build(sources)
    assert message in str(err.value)


def test_build_keeps_the_sources_order_and_leaves_them_as_they_were() -> None:
    a, b, c = _named("a"), _named("b"), _named("c")
    second = Source("m2", [c, a], {"x": "b"})
    sources = [Source("m1", [b]), second]
    experiments, aliases = build(sources)
    assert list(experiments) == ["b", "c", "a"] and experiments["a"] is a
    assert aliases == {"x": "b"} and second.experiments == [c, a]


_ALONE = """
import importlib, json, sys
from collections.abc import Mapping
from wanspec.bench.experiment import Experiment
name = sys.argv[1]
importlib.import_module(name)
def held(value):
    if isinstance(value, Experiment):
        return [value]
    items = list(value.values()) if isinstance(value, Mapping) else value
    if not isinstance(items, list | tuple | set | frozenset):
        return []
    return [v for v in items if isinstance(v, Experiment)]
elsewhere = sorted(
    f"{m}.{attr}: {e.name}"
    for m, module in list(sys.modules.items())
    if m.startswith("wanspec") and m != name
    for attr, value in list(vars(module).items())
    for e in held(value)
)
loaded = sorted(m for m in sys.modules if m.startswith("wanspec.bench.") and m != name)
from wanspec.bench import registry
print(json.dumps({"elsewhere": elsewhere, "loaded": loaded,
                  "registry": [list(registry.EXPERIMENTS), dict(registry.ALIASES)]}))
"""


@pytest.mark.parametrize("module", [*DOCUMENTED, "wanspec.bench.experiment"])
def test_importing_an_experiment_module_alone_changes_nothing_elsewhere(module: str) -> None:
    """In a fresh interpreter: importing `module` loads no other experiment module nor the
    registry, puts its experiments nowhere but in itself, and the registry imported after it is
    the registry imported alone."""
    run = subprocess.run(
        [sys.executable, "-c", _ALONE, module], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["elsewhere"] == []
    others = {*DOCUMENTED, "wanspec.bench.registry"} - {module}
    assert not others & set(found["loaded"]), found["loaded"]
    assert found["registry"] == [list(EXPERIMENTS), dict(ALIASES)]
