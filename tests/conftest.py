"""Shared fixtures, and how the suite runs: one torch thread per xdist worker, and the time
spent in each test file, printed at the end. Tiny random models are built once per session (per
worker under xdist) into a temporary folder."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

# `make test` runs the suite on several xdist workers, as many as cores: one torch thread each,
# or the workers' thread pools fight over the cores. Set before any model loads (and inherited by
# the commands the tests start); a run without xdist keeps the caller's setting.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["WANSPEC_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch

from wanspec.models.tiny import FAMILIES, make_tiny_model, make_tiny_pair
from worlds import World

if "PYTEST_XDIST_WORKER" in os.environ:
    torch.set_num_threads(1)


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
    _heaviest_files_first_on_workers(items)


def _heaviest_files_first_on_workers(items: list[pytest.Item]) -> None:
    """On xdist workers, the files the markers say are heavy come first: with `--dist loadfile
    --no-loadscope-reorder` (`make test`) the workers take whole files in this order, so the
    long ones start at once instead of trailing after the others (the 1.5B tests alone take
    minutes). Files with `veryslow` tests that run come first, then files by their number of
    `slow` tests, then by their number of `statistical` tests, then the rest, ties in
    collection order; the order within a file is kept. Every worker sorts the same collection
    the same way, as xdist requires."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    weight: dict[str, list[int]] = {}  # file -> [veryslow that run, slow, statistical]
    for item in items:
        counts = weight.setdefault(_file(item), [0, 0, 0])
        counts[0] += "veryslow" in item.keywords and not any(item.iter_markers(name="skip"))
        counts[1] += "slow" in item.keywords
        counts[2] += "statistical" in item.keywords
    first_seen = {path: n for n, path in enumerate(weight)}

    def rank(item: pytest.Item) -> tuple[int, int, int, int]:
        path = _file(item)
        veryslow, slow, statistical = weight[path]
        return (-min(veryslow, 1), -slow, -statistical, first_seen[path])

    items.sort(key=rank)  # stable: the order within a file is kept


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


# Under `--dist loadfile` a worker takes a whole file at a time, except these files, whose tests
# go out one by one: each file takes minutes (its tests seconds to a minute and more), so one
# worker running it alone would finish long after the other. Their module fixtures are cheap next
# to that (the synthetic worlds of the pooled law) or worth loading on both workers (the real
# 0.5B pair: half a minute).
SPREAD_FILES = frozenset({"tests/test_real_pairs.py", "tests/test_protocols_pooled_law.py"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile`, with the tests of SPREAD_FILES each a unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileSpreadingLongFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in SPREAD_FILES else path

    return LoadFileSpreadingLongFiles(config, log)


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


# ----------------------------------------------------------------------------- time per file
# Summed on the process that reports (the xdist controller, which gets every worker's reports):
# setup, call and teardown of each test, so a module's fixtures count for their file.
_FILE_SECONDS: dict[str, float] = defaultdict(float)
_FILE_TESTS: dict[str, set[str]] = defaultdict(set)
_STARTED = [time.monotonic()]


def pytest_sessionstart(session: pytest.Session) -> None:
    _STARTED[0] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]  # the test's file
    _FILE_SECONDS[path] += report.duration
    _FILE_TESTS[path].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The seconds spent in each test file, slowest first, against the run's wall time."""
    if not _FILE_SECONDS or hasattr(terminalreporter.config, "workerinput"):
        return
    total = sum(_FILE_SECONDS.values())
    wall = time.monotonic() - _STARTED[0]
    workers = len(getattr(terminalreporter.config.option, "tx", None) or ()) or 1
    terminalreporter.write_sep("=", "seconds per test file (setup + call + teardown)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        share = 100 * seconds / total if total else 0.0
        terminalreporter.write_line(
            f"{seconds:8.1f} s {share:5.1f} %  {len(_FILE_TESTS[path]):5d} tests  {path}"
        )
    terminalreporter.write_line(
        f"{total:8.1f} s in tests over {len(_FILE_SECONDS)} files; {wall:.1f} s of wall time "
        f"since the session started, on {workers} worker(s)"
    )
