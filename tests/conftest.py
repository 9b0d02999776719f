"""Shared fixtures. Tiny random models are built once per session into a temporary folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wanspec.models.tiny import FAMILIES, make_tiny_model, make_tiny_pair
from worlds import World


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders of tiny Llama, Qwen2 and Gemma3 models (with their tokenizers), by family."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: make_tiny_model(family, root / family, seed=1) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_pair_shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(draft, target) tiny Llama folders sharing one byte-level tokenizer."""
    return make_tiny_pair(tmp_path_factory.mktemp("tiny-pair"), shared=True, seed=2)


@pytest.fixture(scope="session")
def tiny_pair_hetero(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(draft, target): draft has a Metaspace "▁" tokenizer, target a byte-level "Ġ" one."""
    return make_tiny_pair(tmp_path_factory.mktemp("tiny-pair"), shared=False, seed=3)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _quickest_first_under_mutmut(items)
    _skip_veryslow_unless_asked(items)


def _skip_veryslow_unless_asked(items: list[pytest.Item]) -> None:
    """`veryslow` tests (the 1.5B target) run only with WANSPEC_VERYSLOW=1 (CI sets it)."""
    if os.environ.get("WANSPEC_VERYSLOW") == "1":
        return
    skip = pytest.mark.skip(reason="set WANSPEC_VERYSLOW=1 to run the 1.5B-target tests")
    for item in items:
        if "veryslow" in item.keywords:
            item.add_marker(skip)


def _quickest_first_under_mutmut(items: list[pytest.Item]) -> None:
    """Under `make mutate`, run each mutant's tests quickest first (mutmut's own timings).

    mutmut runs the tests that reach a mutant with `-x`, in no set order: a mutant killed by a
    0.01 s exact test may first sit through seconds of end-to-end runs. The clean run before
    the mutants is ordered the same way, so a test that depended on the order would fail there.
    """
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from its mutants/ folder
    if "MUTANT_UNDER_TEST" not in os.environ or not stats.exists():
        return
    seconds = json.loads(stats.read_text())["duration_by_test"]
    items.sort(key=lambda item: seconds.get(item.nodeid, 0.0))


@pytest.fixture(scope="session")
def shared_world() -> World:
    """Synthetic draft and target over one byte-level tokenizer (tests/worlds.py)."""
    return World(shared=True)


@pytest.fixture(scope="session")
def hetero_world() -> World:
    """Synthetic draft and target over different real tiny tokenizers (tests/worlds.py)."""
    return World(shared=False)
