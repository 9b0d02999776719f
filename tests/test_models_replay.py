"""Model jobs replayed from a store shared by runs (wanspec.models.replay): a run with the store
equals a run without it bit for bit (tokens, text, every stat, times included), for every method,
when the second run replays everything and when it leaves the stored path midway (pipelines,
whose drafting depends on the RTT); a small byte cap evicts the least recently started runs
without changing a result; the store is refused where wall time is charged; a sweep with reuse
writes the same results as one without."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import wanspec
from wanspec.bench.config import CONFIGS
from wanspec.bench.runner import Cell, read_results, reuse_order, run_sweep
from wanspec.bench.sweep import run_experiment
from wanspec.cli import main
from wanspec.jobs import Forward, ForwardEmbeddings, KeepTreePath, TreeForward
from wanspec.models.replay import JobReplay, job_key, replaying_executor
from wanspec.protocols.registry import METHODS
from wanspec.sim import MeasuredProfile, load_profile

# a fast cloud and an edge whose tree passes grow with the tree: AceSpec's budget (the tree the
# edge drafts while the reply is in flight) then depends on the RTT, and so do its jobs
EDGE = load_profile(
    {
        "name": "edge-test",
        "forward_ms": {"1": 10.0, "64": 40.0},
        "tree_ms": {"1": 10.0, "64": 100.0},
    }
)
CLOUD = load_profile({"name": "cloud-test", "forward_ms": {"1": 5.0, "64": 20.0}})
FAST = wanspec.Link(bandwidth_bps=1e8, rtt_s=0.001)
SLOW = wanspec.Link(bandwidth_bps=2e4, uplink_bps=5e4, rtt_s=0.3)
PROMPT = "Hello there, how"
SETTINGS = {"max_new_tokens": 12, "gamma": 3, "seed": 1}


@pytest.fixture(scope="module")
def pairs(tiny_pair_hetero, tiny_pair_shared) -> dict[str, wanspec.Pair]:
    loaded = {}
    for kind, (draft, target) in (("hetero", tiny_pair_hetero), ("shared", tiny_pair_shared)):
        loaded[kind] = wanspec.load_pair(target, draft, threads=1)
    return loaded


def _run(pair, method: str, link, reuse=None, prompt: str = PROMPT, **settings):
    return wanspec.generate(
        pair,
        prompt,
        method,
        link=link,
        edge_profile=EDGE,
        cloud_profile=CLOUD,
        reuse=reuse,
        **{**SETTINGS, **settings},
    )


def _same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert a.text == b.text
    assert a.stats == b.stats


def _consistent(store: JobReplay) -> None:
    """The store's byte and node counts are those of what its tries still reach."""
    nbytes = nodes = 0
    for _, root in store._roots.values():
        stack = list(root.children.values())
        while stack:
            node = stack.pop()
            assert node.alive
            nbytes, nodes = nbytes + node.nbytes, nodes + 1
            stack.extend(node.children.values())
    assert (store.nbytes, len(store)) == (nbytes, nodes)
    assert store.nbytes <= store.max_bytes


# every method on a pair it accepts: shared-vocabulary ones on the shared pair, the rest on the
# heterogeneous one
CASES = [
    pytest.param("shared" if info.shared_vocab_only else "hetero", name, t, id=f"{name}-T{t:g}")
    for name, info in METHODS.items()
    for t in (1.0, 0.0)
]


@pytest.mark.parametrize(("kind", "method", "temperature"), CASES)
def test_a_run_with_reuse_equals_a_fresh_run(pairs, kind: str, method: str, temperature: float):
    """Run at one link with a store, then at another with the same store: the second run equals
    a run without the store. A method whose jobs do not depend on timing computes nothing the
    second time; the pipelines draft by the clock, leave the stored path and catch up; xcosd-auto
    picks its rounds' mechanisms by the clock, so it replays at least up to the first round the
    two links decide differently."""
    pair, store = pairs[kind], JobReplay()
    first = _run(pair, method, FAST, store, temperature=temperature)
    _same(first, _run(pair, method, FAST, temperature=temperature))
    stored = store.counters()
    assert stored["passes_run"] > 0 and stored["passes_replayed"] == 0
    second = _run(pair, method, SLOW, store, temperature=temperature)
    _same(second, _run(pair, method, SLOW, temperature=temperature))
    run = store.passes_run - stored["passes_run"]
    replayed = store.passes_replayed
    if METHODS[method].family == "pipeline":
        assert run > 0 and replayed > 0 and store.passes_caught_up > 0
    elif METHODS[method].tokens_follow_timing:
        assert replayed > 0
    else:
        assert run == 0 and replayed == stored["passes_run"]
    _consistent(store)


def test_acespecs_tree_follows_the_rtt_and_replay_catches_up(pairs) -> None:
    """The divergence in detail: AceSpec's budget differs between the links, yet the rounds
    before the first difference replay, the session catches up on exactly them, and the
    result is the fresh run's; the reverse order, from the small trees to the big, too."""
    pair = pairs["shared"]
    for a, b in ((FAST, SLOW), (SLOW, FAST)):
        store = JobReplay()
        first = _run(pair, "acespec", a, store)
        second = _run(pair, "acespec", b, store)
        assert first.stats["budget_per_round"] != second.stats["budget_per_round"]
        assert 0 < store.passes_caught_up <= store.passes_replayed
        _same(second, _run(pair, "acespec", b))
        _consistent(store)


def test_results_are_copies_and_failed_jobs_are_not_stored(pairs) -> None:
    model = pairs["shared"].target
    store = JobReplay()
    job = Forward(0, (5, 9, 17), rows=2)
    fresh = replaying_executor(model, store)(job).block
    computed = fresh.clone()
    with torch.inference_mode():  # a pass's result, and so its replay, is an inference tensor
        fresh += 1.0  # the caller's tensor is its own: the store keeps the computed rows
        first = replaying_executor(model, store)(job).block
        assert store.passes_replayed == 1 and first.is_inference()
        assert torch.equal(first, computed)
        first.zero_()
    assert torch.equal(replaying_executor(model, store)(job).block, computed)
    # a job that raises leaves nothing behind: the next run meets the same error
    bad = Forward(7, (5,))  # keeps 7 cached tokens of a session holding 3
    for _ in range(2):
        executor = replaying_executor(model, store)
        executor(job)
        nodes = len(store)
        with pytest.raises(RuntimeError, match="keeps 7"):
            executor(Forward(7, (5,)))
        assert len(store) == nodes
    assert bad not in next(iter(store._roots.values()))[1].children[job_key(job)].children
    _consistent(store)


def test_job_keys_tell_jobs_apart_and_match_equal_ones() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    embed = job_key(ForwardEmbeddings(2, rows))
    assert embed == job_key(ForwardEmbeddings(2, rows.copy()))
    other = rows.copy()
    other[1, 2] += 1
    for different in (
        ForwardEmbeddings(2, other),
        ForwardEmbeddings(1, rows),
        ForwardEmbeddings(2, rows.reshape(4, 3)),
        ForwardEmbeddings(2, rows.astype(np.float64)),
    ):
        assert job_key(different) != embed
    keys = {
        job_key(j)
        for j in (
            Forward(0, (1, 2)),
            Forward(0, (1, 2), rows=2),
            Forward(1, (1, 2)),
            Forward(0, (2, 1)),
            TreeForward((1, 2), (-1, 0)),
            TreeForward((1, 2), (-1, -1)),
            KeepTreePath((0, 1)),
            KeepTreePath((0, 1), keep_descendants=True),
        )
    }
    assert len(keys) == 8
    assert job_key(Forward(0, [1, 2])) == job_key(Forward(0, (1, 2)))


@pytest.mark.parametrize(
    "profile", ["measured", MeasuredProfile(scale=2.0)], ids=["name", "object"]
)
def test_reuse_is_refused_where_wall_time_is_charged(pairs, profile) -> None:
    pair, store = pairs["shared"], JobReplay()
    with pytest.raises(ValueError, match="fixed compute profiles"):
        wanspec.generate(pair, PROMPT, "sd", reuse=store, max_new_tokens=2)  # default: measured
    with pytest.raises(ValueError, match="cloud profile"):
        wanspec.generate(pair, PROMPT, "sd", reuse=store, edge_profile=EDGE, cloud_profile=profile)
    with pytest.raises(ValueError, match="edge profile"):
        wanspec.generate(pair, PROMPT, "sd", reuse=store, profile=profile)

    class Stopwatch:  # any profile whose price follows the wall time
        name, source = "stopwatch", ""

        def seconds(self, cost, wall_s=None):
            return 2 * wall_s

    with pytest.raises(ValueError, match="stopwatch"):
        wanspec.generate(pair, PROMPT, "sd", reuse=store, edge_profile=Stopwatch(), profile=CLOUD)
    with pytest.raises(ValueError, match="charge_protocol_cpu"):
        wanspec.generate(pair, PROMPT, "sd", reuse=store, profile=EDGE, charge_protocol_cpu=True)
    with pytest.raises(ValueError, match="server"):
        wanspec.generate(pair, PROMPT, "sd", reuse=store, profile=EDGE, server="localhost:1")
    assert store.passes_run == 0 and len(store) == 0


def test_the_byte_cap_forgets_the_least_recently_started_runs(pairs) -> None:
    pair = pairs["shared"]
    prompts = ["one two three", "four five six", "seven eight nine"]
    sizes = []
    for p in prompts:
        alone = JobReplay()
        _run(pair, "ar", FAST, alone, prompt=p)
        sizes.append(alone.nbytes)
    store = JobReplay(max_bytes=sizes[1] + sizes[2] + sizes[0] // 2)  # not room for all three
    fresh = {p: _run(pair, "ar", FAST, prompt=p) for p in prompts}
    for p in prompts:
        _same(_run(pair, "ar", FAST, store, prompt=p), fresh[p])
    assert store.evicted > 0
    _consistent(store)
    ran = store.passes_run
    _same(_run(pair, "ar", FAST, store, prompt=prompts[1]), fresh[prompts[1]])
    _same(_run(pair, "ar", FAST, store, prompt=prompts[2]), fresh[prompts[2]])
    assert store.passes_run == ran  # the two newest runs are kept
    _same(_run(pair, "ar", FAST, store, prompt=prompts[0]), fresh[prompts[0]])
    assert store.passes_run > ran  # the oldest was forgotten
    _consistent(store)


@pytest.mark.parametrize("max_bytes", [0, 3000, 40000])
@pytest.mark.parametrize("method", ["acespec", "xcosd-e"])
def test_results_stay_exact_when_the_cap_evicts_paths_in_use(pairs, method, max_bytes) -> None:
    """Under a cap smaller than one run the store evicts the path a run is on (its own, or the
    other side's); the run carries on with its own session, catching up first where it had
    replayed, and its result does not change."""
    pair = pairs["shared"]
    store = JobReplay(max_bytes=max_bytes)
    for link in (FAST, SLOW, FAST):
        _same(_run(pair, method, link, store), _run(pair, method, link))
        _consistent(store)
    assert store.evicted > 0


# ============================================================================ sweeps


def test_cells_that_differ_in_timing_only_run_together(tmp_path: Path) -> None:
    def cell(method: str, rtt: float, profile: str = "a") -> Cell:
        settings = {"method": method, "link": {"rtt_s": rtt}, "edge_profile": profile}
        return Cell(f"{method} {rtt} {profile}", settings)

    cells = [cell("x", 1), cell("y", 1), cell("x", 2), cell("y", 2), cell("x", 2, "b")]
    assert [c.key for c in reuse_order(cells)] == ["x 1 a", "x 2 a", "x 2 b", "y 1 a", "y 2 a"]
    ran: list[str] = []
    summary = run_sweep(cells[1:], tmp_path, lambda c: ran.append(c.key) or {}, progress=False)
    assert ran == ["y 1 a", "y 2 a", "x 2 a", "x 2 b"] == [c.key for c in reuse_order(cells[1:])]
    assert len(summary.ran) == 4
    # once the sweep is done the file lists the lines in cell order; a resumed sweep appends
    # its cells after the earlier ones
    run_sweep(cells, tmp_path, lambda c: ran.append(c.key) or {}, progress=False)
    lines = [json.loads(t)["key"] for t in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines == [c.key for c in cells[1:]] + ["x 1 a"]
    assert set(read_results(tmp_path)) == {c.hash for c in cells}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    """A private WANSPEC_HOME (the tiny pair is built there once)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        yield


def test_a_sweep_with_reuse_writes_the_results_of_one_without(home, tmp_path: Path) -> None:
    config = replace(CONFIGS["tiny"], prompts=1)
    with_reuse = run_experiment("xcosd-rate", config, tmp_path / "reuse", progress=False)
    args = ["bench", "xcosd-rate", "--config", "tiny", "--prompts", "1", "--no-progress"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "fresh"), "--no-reuse"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "replayed" not in result.output

    def results(out: str) -> tuple[dict, dict]:
        folder = tmp_path / out / "xcosd-rate"
        manifest = json.loads((folder / "manifest.json").read_text())
        lines = [json.loads(t) for t in (folder / "results.jsonl").read_text().splitlines()]
        assert [line["hash"] for line in lines] == manifest["cells"]
        return {line["hash"]: line["result"] for line in lines}, manifest["runs"][-1]

    reused, run = results("reuse")
    fresh, fresh_run = results("fresh")
    assert reused == fresh and len(reused) == 18
    assert with_reuse.reuse is not None
    assert run["passes_replayed"] == with_reuse.reuse["passes_replayed"] > 0
    assert run["passes_run"] == with_reuse.reuse["passes_run"] > 0
    assert "passes_run" not in fresh_run and fresh_run["command"].endswith("--no-reuse")
