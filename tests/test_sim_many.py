"""Many edges sharing one batching cloud on the simulator (`wanspec.sim.simulate_many`), its
batched-pass pricing, and `wanspec bench capacity` (synthetic pair: each run takes milliseconds)."""

from __future__ import annotations

import csv
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from wanspec.bench.capacity import capacity
from wanspec.bench.config import CONFIGS, TINY_SHARED_PAIR
from wanspec.bench.context import Context
from wanspec.bench.registry import EXPERIMENTS
from wanspec.cli import main
from wanspec.jobs import ComputeCost
from wanspec.models.jobs import session_executor
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec
from wanspec.models.tiny import build_tokenizer
from wanspec.protocols.registry import build_machines
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import (
    EdgeSession,
    Link,
    ManyResult,
    SimResult,
    load_profile,
    simulate,
    simulate_many,
)
from wanspec.vocab import VocabAlignment

# a cloud whose passes grow with their tokens (so batching has a price) and a context term
CLOUD = load_profile(
    {
        "name": "cloud",
        "forward_ms": {"1": 30.0, "8": 32.0, "64": 60.0},
        "context_ms_per_token": 0.01,
        "batch_session_ms": 0.5,
    }
)
EDGE = load_profile({"name": "edge", "forward_ms": {"1": 4.0, "64": 9.0}})
FAST = Link(bandwidth_bps=100e6, rtt_s=0.05)


@pytest.fixture(scope="module")
def pair() -> tuple[VocabAlignment, SyntheticLM, SyntheticLM]:
    alignment = VocabAlignment.identity(build_tokenizer("bytelevel", 300))
    spec = SyntheticSpec(0.7, vocab_size=alignment.target_width, seed=5)
    return alignment, SyntheticLM(spec, "draft"), SyntheticLM(spec, "target")


def _session(
    pair,
    i: int,
    *,
    method: str = "cosd",
    link: Link = FAST,
    start: float = 0.0,
    tokens: int = 32,
    prompt: int = 3,
) -> EdgeSession:
    """Edge i's request: its own prompt ids (`prompt` of them) and seed, its own sessions."""
    alignment, draft, target = pair
    ids = [7 + (k * 13 + i) % 250 for k in range(prompt - 3)] + [7, 8, 9 + i]
    edge, cloud = build_machines(
        method,
        draft_lm=draft,
        target_lm=target,
        alignment=alignment,
        draft_encode=lambda _: ids,
        target_encode=lambda _: ids,
        target_decode=lambda ids: "",
        prompt="",
        settings=GenerationSettings(gamma=4, max_new_tokens=tokens, seed=i, temperature=1.0),
    )
    executors = (session_executor(draft), session_executor(target))
    return EdgeSession(edge, cloud, link, *executors, EDGE, start)


def _alone(spec: EdgeSession) -> SimResult:
    """The same request on `simulate`, the single-request entry point."""
    return simulate(
        spec.edge,
        spec.cloud,
        spec.link,
        spec.edge_profile,
        CLOUD,
        edge_executor=spec.edge_executor,
        cloud_executor=spec.cloud_executor,
    )


def _batched(run: ManyResult) -> int:
    return max(len(p.sessions) for p in run.passes)


# ============================================================================ exactness


MIXED = [  # (method, link, start): different methods, links and arrival times on one cloud
    ("cosd", FAST, 0.0),
    ("sd", Link(bandwidth_bps=1e6, rtt_s=0.02, jitter_s=0.004, seed=1), 0.01),
    ("ar", Link(bandwidth_bps=1e7, rtt_s=0.1, seed=2), 0.0),
    ("picospec", Link(bandwidth_bps=5e5, rtt_s=0.05, loss=0.1, seed=3), 0.03),
    ("cosd", Link(bandwidth_bps=2e5, rtt_s=0.15, jitter_s=0.01, seed=4), 0.05),
    ("acespec", FAST, 0.0),
]


def test_every_session_gets_the_tokens_it_gets_alone(pair) -> None:
    run = simulate_many(
        [_session(pair, i, method=m, link=k, start=t) for i, (m, k, t) in enumerate(MIXED)], CLOUD
    )
    assert _batched(run) >= 3  # the sessions did share passes
    for i, (method, link, _) in enumerate(MIXED):
        alone = _alone(_session(pair, i, method=method, link=link))
        shared = run.sessions[i]
        assert shared.finish_reason == alone.finish_reason == "length"
        assert shared.tokens == alone.tokens, (i, method)
        assert shared.bits == alone.bits  # the same messages crossed each link


def test_one_session_times_exactly_as_the_single_request_driver(pair) -> None:
    link = Link(bandwidth_bps=3e5, rtt_s=0.07, jitter_s=0.01, loss=0.05, seed=9)
    for method in ("cosd", "picospec"):
        alone = _alone(_session(pair, 3, method=method, link=link))
        for start in (0.0, 0.75):  # a later start: the same run on its own clock
            spec = _session(pair, 3, method=method, link=link, start=start)
            (shared,) = simulate_many([spec], CLOUD).sessions
            assert shared.duration_s == pytest.approx(alone.duration_s, abs=1e-9)
            assert [e.token_ids for e in shared.emits] == [e.token_ids for e in alone.emits]
            times = [e.t for e in shared.emits]
            assert times == pytest.approx([e.t for e in alone.emits], abs=1e-9)
            for name in ("bits", "compute_by_tag", "computes", "retransmissions"):
                assert getattr(shared, name) == getattr(alone, name), (method, name)
            assert shared.compute_busy_s == pytest.approx(alone.compute_busy_s)


@pytest.mark.parametrize("method", ["cosd", "picospec", "acespec"])
def test_simulate_is_simulate_many_of_one_session(pair, method: str) -> None:
    """One runtime: the single-request entry point and a lone session on the shared cloud give
    the same result, field for field, the trace's every step in the same order included (a
    short prompt is one pass whatever `prefill_chunk`)."""
    link = Link(bandwidth_bps=3e5, rtt_s=0.07, jitter_s=0.01, loss=0.05, seed=9)
    spec = _session(pair, 2, method=method, link=link)
    alone = simulate(
        spec.edge,
        spec.cloud,
        spec.link,
        spec.edge_profile,
        CLOUD,
        edge_executor=spec.edge_executor,
        cloud_executor=spec.cloud_executor,
        trace=True,
    )
    for chunk in (0, 16):
        again = _session(pair, 2, method=method, link=link)
        (shared,) = simulate_many([again], CLOUD, prefill_chunk=chunk, trace=True).sessions
        assert shared.trace is not None and len(shared.trace) > 50
        assert shared == alone, (method, chunk)


def test_sessions_that_never_overlap_each_time_as_alone(pair) -> None:
    alone = _alone(_session(pair, 0))
    later = alone.duration_s + 1.0  # the second starts after the first has finished
    run = simulate_many([_session(pair, 0), _session(pair, 1, start=later)], CLOUD)
    assert _batched(run) == 1
    assert run.sessions[0].duration_s == pytest.approx(alone.duration_s, abs=1e-9)
    assert run.sessions[1].duration_s == pytest.approx(_alone(_session(pair, 1)).duration_s)


def test_real_tiny_models_on_one_cloud_give_each_session_its_alone_tokens(tiny_pair_shared):
    import wanspec

    draft_dir, target_dir = tiny_pair_shared
    real = wanspec.load_pair(target_dir, draft_dir, threads=1)
    prompts = ["The cloud verifies", "An edge drafts a few", "Many edges, one"]

    def session(i: int, method: str) -> EdgeSession:
        edge, cloud = build_machines(
            method,
            draft_lm=real.draft,
            target_lm=real.target,
            alignment=real.alignment,
            draft_encode=real.draft_encode,
            target_encode=real.target_encode,
            target_decode=real.decode,
            prompt=prompts[i],
            settings=GenerationSettings(gamma=3, max_new_tokens=10, seed=i, temperature=1.0),
        )
        executors = (session_executor(real.draft), session_executor(real.target))
        return EdgeSession(edge, cloud, FAST, *executors, EDGE, 0.001 * i)

    methods = ["cosd", "picospec", "ar"]
    run = simulate_many([session(i, m) for i, m in enumerate(methods)], CLOUD)
    assert _batched(run) >= 2
    for i, method in enumerate(methods):
        alone = _alone(session(i, method))
        assert run.sessions[i].tokens == alone.tokens and len(alone.tokens) == 10, method


# ============================================================================ batched pricing


def test_batch_price_of_one_job_is_its_price_and_of_several_is_one_pass() -> None:
    jobs = [ComputeCost("forward", n=5, context=40), ComputeCost("forward", n=9, context=100)]
    assert CLOUD.batch_seconds(jobs[:1]) == CLOUD.seconds(jobs[0])
    # one pass over 14 tokens, both contexts, one further session
    expected_ms = CLOUD.forward(14) + 0.01 * 140 + 0.5
    assert CLOUD.batch_seconds(jobs) == pytest.approx(expected_ms / 1000)
    assert CLOUD.batch_seconds(jobs) < sum(CLOUD.seconds(c) for c in jobs)
    trees = load_profile({"forward_ms": {"1": 10.0, "65": 74.0}, "tree_ms": {"1": 5.0}})
    tree, chain = ComputeCost("tree", n=6), ComputeCost("forward", n=6)
    assert trees.batch_seconds([tree, tree]) == pytest.approx(0.005)  # trees: the tree curve
    assert trees.batch_seconds([tree, chain]) == pytest.approx(0.021)  # else the forward one
    cpu = load_profile({"forward_ms": {"1": 10.0}, "cpu_ms": 2.0})
    bookkeeping = [ComputeCost("cpu", n=3), ComputeCost("cpu", n=1)]
    assert cpu.batch_seconds(bookkeeping) == pytest.approx(0.002)  # side by side
    with pytest.raises(ValueError, match="at least one job"):
        CLOUD.batch_seconds([])
    with pytest.raises(ValueError, match="2 passes"):
        CLOUD.batch_seconds([*jobs, ComputeCost("forward", n=1, passes=2)])


def test_shared_cloud_is_busy_less_than_the_sum_of_singles_and_at_least_the_largest(pair) -> None:
    specs = [_session(pair, i, start=0.002 * i) for i in range(5)]
    run = simulate_many(specs, CLOUD)
    singles = [_alone(_session(pair, i)).compute_busy_s["cloud"] for i in range(5)]
    assert _batched(run) >= 4
    assert max(singles) <= run.cloud_busy_s < 0.8 * sum(singles)


def test_shipped_a100_profiles_price_a_batch_below_its_jobs_one_by_one() -> None:
    verify = ComputeCost("forward", n=5, context=300)
    for name in ("cloud-a100-8b", "cloud-a100-32b", "cloud-a100x4-70b"):
        profile = load_profile(name)
        one, batch = profile.seconds(verify), profile.batch_seconds([verify] * 16)
        assert profile.batch_session_ms > 0, name
        assert one < batch < 16 * one / 4, name  # more than one pass, far less than sixteen


def test_the_token_cap_splits_a_batch_and_keeps_the_tokens(pair) -> None:
    uncapped = simulate_many([_session(pair, i) for i in range(4)], CLOUD)
    assert max(p.tokens for p in uncapped.passes) > 12
    run = simulate_many([_session(pair, i) for i in range(4)], CLOUD, max_batch_tokens=12)
    assert all(p.tokens <= 12 or len(p.sessions) == 1 for p in run.passes)
    assert all(p.padded_tokens <= 12 or len(p.sessions) == 1 for p in run.passes)
    assert _batched(run) > 1
    for i in range(4):
        assert run.sessions[i].tokens == _alone(_session(pair, i)).tokens


def test_no_batching_runs_one_job_per_pass(pair) -> None:
    """`max_batch_tokens=0`, as `wanspec serve --no-batching`: one job per pass, the same tokens,
    the accelerator busier than when it batches."""
    run = simulate_many([_session(pair, i) for i in range(4)], CLOUD, max_batch_tokens=0)
    batched = simulate_many([_session(pair, i) for i in range(4)], CLOUD)
    assert _batched(run) == 1 and _batched(batched) > 1
    assert run.cloud_busy_s > batched.cloud_busy_s
    for i in range(4):
        assert run.sessions[i].tokens == _alone(_session(pair, i)).tokens


def test_a_long_prompt_is_fed_in_pieces_as_the_server_feeds_it(pair) -> None:
    """A 40-token prompt with `prefill_chunk=16`: three passes of 16, 16, 8 tokens, each priced
    after the cache the earlier ones built, the job still one job with its alone tokens; other
    sessions' jobs run between the pieces. With `prefill_chunk=0` it times as `simulate`."""
    alone = _alone(_session(pair, 0, prompt=40))
    (whole,) = simulate_many([_session(pair, 0, prompt=40)], CLOUD, prefill_chunk=0).sessions
    assert whole.duration_s == pytest.approx(alone.duration_s, abs=1e-9)
    lone = simulate_many([_session(pair, 0, prompt=40)], CLOUD, prefill_chunk=16)
    pieces = [ComputeCost("forward", n=n, context=c) for n, c in ((16, 0), (16, 16), (8, 32))]
    assert [p.tokens for p in lone.passes[:3]] == [16, 16, 8]
    assert [p.seconds for p in lone.passes[:3]] == pytest.approx([CLOUD.seconds(c) for c in pieces])
    (res,) = lone.sessions
    assert res.tokens == alone.tokens and res.computes == alone.computes
    prefill = ComputeCost("forward", n=40, context=0)
    extra = sum(CLOUD.seconds(c) for c in pieces) - CLOUD.seconds(prefill)
    assert res.compute_busy_s["cloud"] == pytest.approx(alone.compute_busy_s["cloud"] + extra)
    prompts = [40, 3, 3, 3]
    specs = [_session(pair, i, start=1e-3 * i, prompt=n) for i, n in enumerate(prompts)]
    run = simulate_many(specs, CLOUD, prefill_chunk=16)
    with_0 = [k for k, p in enumerate(run.passes) if 0 in p.sessions]
    others = [k for k, p in enumerate(run.passes) if set(p.sessions) - {0}]
    assert others[0] < with_0[2]  # another session's job ran before the prompt's last piece
    for i in range(4):
        assert run.sessions[i].tokens == _alone(_session(pair, i, prompt=prompts[i])).tokens


# ============================================================================ a slow edge


def test_a_slow_edge_delays_the_others_by_at_most_one_pass(pair) -> None:
    slow = Link(bandwidth_bps=10e3, rtt_s=0.05, seed=11)
    mixed = simulate_many(
        [_session(pair, 0, link=slow), *[_session(pair, i) for i in (1, 2, 3, 4)]], CLOUD
    )
    fast = simulate_many([_session(pair, i) for i in range(5)], CLOUD)
    assert mixed.sessions[0].duration_s > 1.3 * fast.sessions[0].duration_s  # it is slow
    longest = max(p.seconds for p in mixed.passes)
    for p in mixed.passes:
        for i, wait in zip(p.sessions, p.waits, strict=True):
            if i != 0:
                assert wait <= longest + 1e-9, (i, wait, longest)
    for i in (1, 2, 3, 4):
        rounds = mixed.sessions[i].computes["cloud"]
        slack = rounds * longest
        assert mixed.sessions[i].duration_s <= fast.sessions[i].duration_s + slack


# ============================================================================ errors


def test_bad_input_gets_a_clear_error(pair) -> None:
    with pytest.raises(ValueError, match="at least one session"):
        simulate_many([], CLOUD)
    with pytest.raises(ValueError, match="table profile"):
        simulate_many([_session(pair, 0), _session(pair, 1)], "measured")
    with pytest.raises(ValueError, match="max_batch_tokens"):
        simulate_many([_session(pair, 0)], CLOUD, max_batch_tokens=-1)
    with pytest.raises(ValueError, match="prefill_chunk"):
        simulate_many([_session(pair, 0)], CLOUD, prefill_chunk=-1)
    with pytest.raises(TypeError, match="prefill_chunk"):
        simulate_many([_session(pair, 0)], CLOUD, prefill_chunk=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start_s"):
        simulate_many([replace(_session(pair, 0), start_s=-1.0)], CLOUD)
    with pytest.raises(TypeError, match="EdgeSession"):
        simulate_many([object()], CLOUD)  # type: ignore[list-item]


# ============================================================================ the bench


def test_capacity_is_the_last_n_before_the_first_drop() -> None:
    def rows(within: list[bool]) -> list[dict]:
        key = {"cloud": "c", "edge": "e", "RTT ms": 50.0}
        shared = [{**key, "edges": 2**i, "within 20%": w} for i, w in enumerate(within)]
        return [{**key, "edges": "alone"}, *reversed(shared)]

    assert capacity(rows([True, True, False, True])) == {("c", "e", 50.0): (2, False)}
    assert capacity(rows([True, True, True])) == {("c", "e", 50.0): (4, True)}
    assert capacity(rows([False, True])) == {("c", "e", 50.0): (0, False)}


def test_capacity_real_runs_real_models_and_one_edge_matches_it_alone(tiny_pair_shared) -> None:
    import wanspec

    draft_dir, target_dir = tiny_pair_shared
    real = wanspec.load_pair(target_dir, draft_dir, threads=1)
    ctx = Context(pairs={TINY_SHARED_PAIR: real})
    experiment = EXPERIMENTS["capacity-real"]
    cells = experiment.cells(CONFIGS["tiny"], ctx)
    lines = [{"settings": c.settings, "result": experiment.run_cell(c, ctx)} for c in cells]
    rows = experiment.table(lines)
    assert [r["edges"] for r in rows] == ["alone", 1, 2]
    assert all(tuple(c.settings["pair"]) == TINY_SHARED_PAIR for c in cells)
    assert rows[1]["vs alone"] == pytest.approx(1.0, abs=1e-12)
    assert rows[1]["per-edge tok/s"] > 0 and rows[2]["total tok/s"] > rows[1]["total tok/s"]


def test_capacity_bench_tiny_agrees_with_its_own_table(tmp_path: Path) -> None:
    args = ["bench", "capacity", "--config", "tiny", "--out", str(tmp_path), "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    with open(tmp_path / "capacity" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    alone = next(r for r in rows if r["edges"] == "alone")
    shared = sorted((r for r in rows if r["edges"] != "alone"), key=lambda r: int(r["edges"]))
    assert [int(r["edges"]) for r in shared] == [1, 2, 4]
    one = shared[0]  # one edge on the shared cloud is exactly that edge alone
    assert float(one["vs alone"]) == pytest.approx(1.0, abs=1e-12)
    assert float(one["vs 1 edge"]) == 1.0
    assert float(one["total tok/s"]) == pytest.approx(float(one["per-edge tok/s"]))
    assert float(alone["per-edge tok/s"]) > 0
    for r in shared:
        assert (r["within 20%"] == "True") == (float(r["vs alone"]) >= 0.8)
        assert float(r["worst edge vs alone"]) <= float(r["vs alone"]) + 1e-12
        assert 0 < float(r["cloud busy"]) <= 1
    assert float(shared[-1]["total tok/s"]) > float(shared[0]["total tok/s"])
    # the summary's count: every N up to it within 20%, the next one (if any) not
    summary = (tmp_path / "capacity" / "summary.md").read_text()
    match = re.search(r"\| 50 \| (≥ )?(\d+) \|", summary)
    assert match, summary
    n = int(match.group(2))
    within = [r["within 20%"] == "True" for r in shared]
    edges = [int(r["edges"]) for r in shared]
    assert all(within[: edges.index(n) + 1])
    assert bool(match.group(1)) == all(within)
    if not all(within):
        assert not within[edges.index(n) + 1]
    assert math.isfinite(float(shared[-1]["max wait ms"]))
