"""The simulator's link model, compute profiles and event loop, on hand-written toy machines."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from wanspec.jobs import ComputeCost
from wanspec.protocols.base import (
    Cancel,
    Compute,
    ComputeDone,
    Emit,
    Finish,
    MessageReceived,
    Send,
    Start,
)
from wanspec.sim import (
    Curve,
    Link,
    MeasuredProfile,
    SimulationDeadlock,
    SimulationTimeout,
    TableProfile,
    available_profiles,
    link_preset,
    load_profile,
    simulate,
)


# ============================================================================ toy messages/machines
@dataclass(frozen=True)
class Thunk:
    """A toy job: its cost, and a function the toy executor calls for its result."""

    cost: ComputeCost
    fn: Callable[[], Any] = field(compare=False)


def run_thunk(job: Thunk) -> Any:
    return job.fn()


EXECUTORS = {"edge_executor": run_thunk, "cloud_executor": run_thunk}


@dataclass(frozen=True)
class Ping:
    k: int
    size_bits: int


@dataclass(frozen=True)
class Pong:
    k: int
    size_bits: int


def toy_bits(msg: Ping | Pong) -> int:
    return msg.size_bits


class PingEdge:
    """Sends Ping, waits for Pong, `rounds` times; emits the round number each time."""

    side = "edge"

    def __init__(self, rounds: int, bits: int) -> None:
        self.rounds, self.bits, self.log = rounds, bits, []

    def handle(self, event):
        self.log.append(event)
        if isinstance(event, Start):
            return [Send(Ping(0, self.bits))]
        k = event.msg.k
        if k + 1 == self.rounds:
            return [Emit((k,)), Finish("length")]
        return [Emit((k,)), Send(Ping(k + 1, self.bits))]


class PongCloud:
    side = "cloud"

    def __init__(self, bits: int) -> None:
        self.bits, self.log = bits, []

    def handle(self, event):
        self.log.append(event)
        if isinstance(event, MessageReceived):
            return [Send(Pong(event.msg.k, self.bits))]
        return []


class DraftEdge:
    """Computes a γ-pass draft, sends it, waits for the verdict; `rounds` times."""

    side = "edge"

    def __init__(self, rounds: int, gamma: int, bits: int) -> None:
        self.rounds, self.gamma, self.bits, self.done = rounds, gamma, bits, 0
        self.results = []

    def draft(self) -> list[Compute]:
        cost = ComputeCost("forward", n=1, context=10, passes=self.gamma)
        return [Compute(self.done, Thunk(cost, lambda: ("drafted", self.done)), "draft")]

    def handle(self, event):
        if isinstance(event, Start):
            return self.draft()
        if isinstance(event, ComputeDone):
            self.results.append(event.result)
            return [Send(Ping(self.done, self.bits))]
        self.done += 1
        out = [Emit(tuple(range(event.msg.k, event.msg.k + self.gamma)))]
        return [*out, Finish("length")] if self.done == self.rounds else [*out, *self.draft()]


class VerifyCloud:
    side = "cloud"

    def __init__(self, gamma: int, bits: int) -> None:
        self.gamma, self.bits, self.pending = gamma, bits, []

    def handle(self, event):
        if isinstance(event, MessageReceived):
            self.pending.append(event.msg.k)
            cost = ComputeCost("forward", n=self.gamma + 1)
            return [Compute(event.msg.k, Thunk(cost, lambda: None), "verify")]
        if isinstance(event, ComputeDone):
            return [Send(Pong(self.pending.pop(0), self.bits))]
        return []


class Scripted:
    """Returns a fixed list of actions on Start and records every event with its order."""

    def __init__(self, side: str, on_start: list, journal: list) -> None:
        self.side, self.on_start, self.journal = side, on_start, journal

    def handle(self, event):
        self.journal.append((self.side, event))
        return list(self.on_start) if isinstance(event, Start) else []


def flat(ms: float, name: str = "flat") -> TableProfile:
    return TableProfile(name, Curve((1.0,), (ms,)))


LINEAR = TableProfile("linear", Curve((1.0, 2.0), (10.0, 12.0)))  # 10 ms + 2 ms per extra token


# ============================================================================ link
def test_single_message_takes_serialisation_plus_half_rtt() -> None:
    link = Link(bandwidth_bps=1e6, rtt_s=0.08)
    tx = link.channel("up").transmit(1.5, 12_000)
    assert tx.arrival == pytest.approx(1.5 + 12_000 / 1e6 + 0.04, abs=1e-12)
    assert tx.retries == 0


def test_back_to_back_messages_queue_fifo() -> None:
    channel = Link(bandwidth_bps=1e6, rtt_s=0.02).channel("up")
    first = channel.transmit(0.0, 10_000)
    second = channel.transmit(0.0, 5_000)
    later = channel.transmit(1.0, 1_000)  # the link is idle again by then
    assert first.arrival == pytest.approx(0.010 + 0.01, abs=1e-12)
    assert second.start == pytest.approx(0.010, abs=1e-12)
    assert second.arrival == pytest.approx(0.015 + 0.01, abs=1e-12)
    assert later.start == 1.0 and later.arrival == pytest.approx(1.011, abs=1e-12)


def test_asymmetric_bandwidth_per_direction() -> None:
    link = Link(bandwidth_bps=1e6, rtt_s=0.0, uplink_bps=1e5, downlink_bps=4e6)
    assert link.channel("up").transmit(0.0, 100_000).arrival == pytest.approx(1.0)
    assert link.channel("down").transmit(0.0, 100_000).arrival == pytest.approx(0.025)
    only_up = Link(bandwidth_bps=2e6, rtt_s=0.0, uplink_bps=1e6)
    assert only_up.channel("down").transmit(0.0, 2_000_000).arrival == pytest.approx(1.0)


def test_infinite_bandwidth_means_pure_propagation() -> None:
    assert Link(math.inf, rtt_s=0.1).channel("down").transmit(0.0, 10**9).arrival == 0.05


def arrivals(link: Link, n: int, gap: float = 0.0, bits: int = 1000) -> np.ndarray:
    channel = link.channel("up")
    return np.array([channel.transmit(i * gap, bits).arrival for i in range(n)])


def test_jitter_is_seeded_non_negative_and_never_reorders() -> None:
    jittery = Link(1e6, rtt_s=0.05, jitter_s=0.01, seed=3)
    a, b = arrivals(jittery, 2000, gap=0.002), arrivals(jittery, 2000, gap=0.002)
    other = arrivals(Link(1e6, rtt_s=0.05, jitter_s=0.01, seed=4), 2000, gap=0.002)
    base = arrivals(Link(1e6, rtt_s=0.05), 2000, gap=0.002)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, other)
    assert np.all(np.diff(a) >= 0)  # in-order delivery although jitter (10 ms) > gap (2 ms)
    assert np.all(a >= base - 1e-12)
    assert np.ptp(a - base) > 0.01


def test_jitter_mean_is_half_normal_when_messages_are_sparse() -> None:
    link = Link(1e9, rtt_s=0.0, jitter_s=0.01, seed=11)
    extra = arrivals(link, 20_000, gap=1.0, bits=0) - np.arange(20_000) * 1.0
    expected = 0.01 * math.sqrt(2 / math.pi)
    assert abs(extra.mean() - expected) < 4 * 0.01 * 0.6 / math.sqrt(20_000)
    assert extra.min() >= 0


def test_loss_triggers_retransmissions_at_the_configured_rate() -> None:
    loss, n, bits = 0.2, 20_000, 1000
    link = Link(1e6, rtt_s=0.1, loss=loss, seed=5)
    channel = link.channel("down")
    txs = [channel.transmit(i * 10.0, bits) for i in range(n)]
    retries = np.array([tx.retries for tx in txs])
    lost_frac = np.mean(retries > 0)
    assert abs(lost_frac - loss) < 4 * math.sqrt(loss * (1 - loss) / n)
    assert abs(retries.mean() - loss / (1 - loss)) < 0.02
    for i, tx in enumerate(txs[:200]):  # each failed attempt costs one timeout (RTT), nothing more
        expected = i * 10.0 + 0.001 + tx.retries * 0.1 + 0.05
        assert tx.arrival == pytest.approx(expected, abs=1e-9)
    assert retries.max() >= 2  # repeated losses happen


def test_custom_retransmit_timeout_and_common_random_numbers() -> None:
    lossy = Link(1e6, rtt_s=0.1, jitter_s=0.02, loss=0.3, retransmit_s=0.5, seed=9).channel("up")
    clean = Link(1e6, rtt_s=0.1, jitter_s=0.02, loss=0.0, seed=9).channel("up")
    retries = 0
    for i in range(300):  # loss on: the same jitter, each failed attempt 0.5 s later
        a, b = lossy.transmit(i * 10.0, 8000), clean.transmit(i * 10.0, 8000)
        assert a.arrival == pytest.approx(b.arrival + a.retries * 0.5, abs=1e-9)
        retries += a.retries
    assert retries > 50


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bandwidth_bps": 0, "rtt_s": 0.1},
        {"bandwidth_bps": -1e6, "rtt_s": 0.1},
        {"bandwidth_bps": float("nan"), "rtt_s": 0.1},
        {"bandwidth_bps": 1e6, "rtt_s": -0.1},
        {"bandwidth_bps": 1e6, "rtt_s": math.inf},
        {"bandwidth_bps": 1e6, "rtt_s": 0.1, "loss": 1.0},
        {"bandwidth_bps": 1e6, "rtt_s": 0.1, "loss": -0.1},
        {"bandwidth_bps": 1e6, "rtt_s": 0.1, "jitter_s": -1.0},
        {"bandwidth_bps": 1e6, "rtt_s": 0.1, "uplink_bps": 0.0},
        {"bandwidth_bps": 1e6, "rtt_s": 0.1, "retransmit_s": -1.0},
        {"bandwidth_bps": 1e6, "rtt_s": 0.1, "seed": -1},
    ],
)
def test_link_rejects_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must"):
        Link(**kwargs)


def test_channel_rejects_bad_sizes_and_directions() -> None:
    link = Link(1e6, rtt_s=0.0)
    with pytest.raises(ValueError, match="direction"):
        link.channel("sideways")
    with pytest.raises(ValueError, match="non-negative int"):
        link.channel("up").transmit(0.0, -8)
    with pytest.raises(ValueError, match="non-negative int"):
        link.channel("up").transmit(0.0, 8.5)


def test_link_presets() -> None:
    five_g = link_preset("wan-5g", seed=7)
    assert (five_g.up_bps, five_g.down_bps, five_g.rtt_s, five_g.seed) == (20e6, 150e6, 0.05, 7)
    with pytest.raises(ValueError, match="unknown link preset"):
        link_preset("wan-carrier-pigeon")


# ============================================================================ profiles
def test_curve_interpolates_and_extrapolates() -> None:
    curve = Curve.from_mapping({"1": 10.0, "5": 14.0, "9": 30.0})
    assert curve(1) == 10.0
    assert curve(3) == pytest.approx(12.0)
    assert curve(7) == pytest.approx(22.0)
    assert curve(13) == pytest.approx(46.0)  # last slope (4 ms/token) continued
    assert curve(0.5) == 10.0  # flat below the first point
    assert Curve((4.0,), (7.0,))(100) == 7.0


def test_table_profile_prices_passes_context_and_kinds() -> None:
    prof = TableProfile(
        "p",
        Curve((1.0, 11.0), (20.0, 40.0)),
        tree=Curve((1.0, 11.0), (30.0, 50.0)),
        context_ms_per_token=0.01,
        cpu_ms=0.5,
    )
    assert prof.seconds(ComputeCost("forward", n=6)) == pytest.approx(0.030)
    # 3 passes of 1 token after 100 cached tokens: contexts 100, 101, 102
    assert prof.seconds(ComputeCost("forward", n=1, context=100, passes=3)) == pytest.approx(
        (3 * 20.0 + 0.01 * 303) / 1000
    )
    assert prof.seconds(ComputeCost("tree", n=6, context=50)) == pytest.approx((40.0 + 0.5) / 1000)
    assert prof.seconds(ComputeCost("cpu", n=1000)) == pytest.approx(0.0005)
    assert prof.seconds(ComputeCost("forward", n=0)) == 0.0
    no_tree = TableProfile("q", Curve((1.0, 11.0), (20.0, 40.0)))
    assert no_tree.seconds(ComputeCost("tree", n=6)) == pytest.approx(0.030)
    with pytest.raises(ValueError, match="must be >= 0"):
        prof.seconds(ComputeCost("forward", n=-1))
    with pytest.raises(ValueError, match="unknown compute kind"):
        prof.seconds(ComputeCost("gpu", n=1))  # type: ignore[arg-type]


def test_shipped_profiles_load_with_sources() -> None:
    names = available_profiles()
    for name in ("edge-orin", "cloud-a100-32b", "cloud-a100x4-70b", "measured"):
        assert names.get(name)
    for name in names:
        prof = load_profile(name)
        assert prof.source, name
        if isinstance(prof, TableProfile):
            assert 0 < prof.seconds(ComputeCost("forward", n=1)) < 1.0
            assert prof.seconds(ComputeCost("forward", n=64)) >= prof.seconds(
                ComputeCost("forward", n=1)
            )
    # AceSpec Table I: Qwen-32B 13.89 tok/s and LLaMA-70B 6.87 tok/s autoregressive on 4x A100
    one = ComputeCost("forward", n=1)
    assert 1 / load_profile("cloud-a100-32b").seconds(one) == pytest.approx(13.89, rel=0.002)
    assert 1 / load_profile("cloud-a100x4-70b").seconds(one) == pytest.approx(6.87, rel=0.002)
    # the piecewise-linear table reproduces profiles.md's formula between its points
    t16 = load_profile("cloud-a100-32b").seconds(ComputeCost("forward", n=16))
    assert t16 * 1000 == pytest.approx(72.0 + 0.219 * 15, abs=1e-6)


def test_bench_json_and_user_profiles(tmp_path, monkeypatch) -> None:
    bench = {
        "model": "tiny",
        "device": "cpu",
        "forward_ms": {"1": [5.0, 9.0, 6.0], "8": 12.0},
        "tree_ms": {"1": 6.0, "16": 21.0},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    prof = load_profile(str(path))
    assert prof.name == "bench"
    assert prof.metadata == {"model": "tiny", "device": "cpu"}
    assert prof.seconds(ComputeCost("forward", n=1)) == pytest.approx(0.006)  # median of repeats
    assert prof.seconds(ComputeCost("tree", n=6)) == pytest.approx(0.011)
    assert load_profile(bench).seconds(ComputeCost("forward", n=8)) == pytest.approx(0.012)
    assert load_profile(prof.to_dict()) == prof

    monkeypatch.setenv("WANSPEC_HOME", str(tmp_path))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu-measured.json").write_text(json.dumps(bench))
    assert load_profile("cpu-measured").seconds(ComputeCost("forward", n=8)) == pytest.approx(0.012)
    assert "cpu-measured" in available_profiles()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"tree_ms": {"1": 1.0}}, "forward_ms"),
        ({"forward_ms": {}}, "non-empty"),
        ({"forward_ms": {"x": 1.0}}, "number of tokens"),
        ({"forward_ms": {"1": "fast"}}, "milliseconds"),
        ({"forward_ms": {"1": -2.0}}, "finite and >= 0"),
        ({"forward_ms": {"0": 2.0}}, ">= 1"),
    ],
)
def test_bad_profiles_are_rejected(data: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_profile(data)


def test_unknown_profile_names_and_files(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown profile 'tpu-v9'"):
        load_profile("tpu-v9")
    with pytest.raises(ValueError, match="does not exist"):
        load_profile(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(str(tmp_path / "bad.json"))


def test_measured_profile_charges_wall_time() -> None:
    assert MeasuredProfile(scale=2.0).seconds(ComputeCost("cpu"), wall_s=0.25) == 0.5
    with pytest.raises(ValueError, match="wall time"):
        MeasuredProfile().seconds(ComputeCost("forward", n=1))


# ============================================================================ driver
def test_ping_pong_exact_virtual_timing() -> None:
    link = Link(bandwidth_bps=1e6, rtt_s=0.05, uplink_bps=2e5)
    edge, cloud = PingEdge(rounds=4, bits=2000), PongCloud(bits=10_000)
    res = simulate(edge, cloud, link, flat(1.0), flat(1.0), size_fn=toy_bits, **EXECUTORS)
    round_trip = 2000 / 2e5 + 0.025 + 10_000 / 1e6 + 0.025
    assert res.duration_s == pytest.approx(4 * round_trip, abs=1e-12)
    assert [r.t for r in res.emits] == pytest.approx([k * round_trip for k in range(1, 5)])
    assert res.tokens == [0, 1, 2, 3] and res.finish_reason == "length"
    assert res.ttft_s == pytest.approx(round_trip)
    tokens, seconds = res.decode_span  # the steady state: after the first emit
    assert tokens == 3 and seconds == pytest.approx(3 * round_trip)
    assert res.bits == {"up": 8000, "down": 40_000}
    assert res.messages == {"up": 4, "down": 4}
    assert res.bits_by_type == {"Ping": 8000, "Pong": 40_000}
    assert res.messages_by_type == {"Ping": 4, "Pong": 4}
    assert res.compute_busy_s == {"edge": 0.0, "cloud": 0.0}
    assert res.tokens_per_s == pytest.approx(1 / round_trip)


def test_compute_then_send_exact_timing_and_results_fed_back() -> None:
    gamma, rounds = 4, 3
    link = Link(bandwidth_bps=1e6, rtt_s=0.1)
    edge, cloud = DraftEdge(rounds, gamma, bits=1000), VerifyCloud(gamma, bits=3000)
    edge_prof = TableProfile("e", Curve((1.0,), (20.0,)), context_ms_per_token=0.5)
    res = simulate(edge, cloud, link, edge_prof, LINEAR, size_fn=toy_bits, **EXECUTORS, trace=True)
    t_draft = (gamma * 20.0 + 0.5 * (10 + 11 + 12 + 13)) / 1000  # the cache grows each pass
    t_verify = (10.0 + 2.0 * gamma) / 1000
    per_round = t_draft + 0.001 + 0.05 + t_verify + 0.003 + 0.05
    assert res.duration_s == pytest.approx(rounds * per_round, abs=1e-12)
    assert res.compute_busy_s["edge"] == pytest.approx(rounds * t_draft)
    assert res.compute_busy_s["cloud"] == pytest.approx(rounds * t_verify)
    assert res.compute_by_tag == {
        "edge": {"draft": pytest.approx(rounds * t_draft)},
        "cloud": {"verify": pytest.approx(rounds * t_verify)},
    }
    assert res.computes == {"edge": rounds, "cloud": rounds}
    assert edge.results == [("drafted", k) for k in range(rounds)]  # run() really ran
    assert len(res.tokens) == rounds * gamma
    whats = [rec.what for rec in res.trace]
    assert whats[:4] == ["compute_start", "compute_end", "send", "recv"]
    assert [rec.t for rec in res.trace] == sorted(rec.t for rec in res.trace)


def test_computations_on_one_side_run_serially_fifo() -> None:
    journal: list = []
    jobs = [
        Compute(0, Thunk(ComputeCost("forward", n=1), lambda: "A")),
        Compute(1, Thunk(ComputeCost("forward", n=3), lambda: "B")),
    ]
    edge = Scripted("edge", jobs, journal)

    def finish_after_b(event):
        journal.append(("edge", event))
        if isinstance(event, Start):
            return list(jobs)
        return [Finish("done")] if event.job_id == 1 else []

    edge.handle = finish_after_b
    res = simulate(
        edge,
        Scripted("cloud", [], journal),
        Link(1e6, 0.0),
        LINEAR,
        LINEAR,
        size_fn=toy_bits,
        **EXECUTORS,
        trace=True,
    )
    done = [(rec.t, rec.info["job_id"]) for rec in res.trace if rec.what == "compute_end"]
    assert done == [(pytest.approx(0.010), 0), (pytest.approx(0.024), 1)]
    assert [e.result for _, e in journal if isinstance(e, ComputeDone)] == ["A", "B"]
    assert res.duration_s == pytest.approx(0.024)


def test_start_goes_to_cloud_then_edge() -> None:
    journal: list = []
    edge = Scripted("edge", [Finish("stop")], journal)
    res = simulate(
        edge,
        Scripted("cloud", [], journal),
        Link(1e6, 0.1),
        LINEAR,
        LINEAR,
        size_fn=toy_bits,
        **EXECUTORS,
    )
    assert [side for side, _ in journal] == ["cloud", "edge"]
    assert res.duration_s == 0.0 and res.tokens == [] and res.ttft_s is None
    assert res.trace is None  # tracing is off by default


def test_deadlock_is_detected() -> None:
    journal: list = []
    edge = Scripted("edge", [Send(Ping(0, 100))], journal)  # the cloud never answers
    with pytest.raises(SimulationDeadlock, match=r"deadlock at t=0\.05"):
        simulate(
            edge,
            Scripted("cloud", [], journal),
            Link(1e6, 0.1),
            LINEAR,
            LINEAR,
            size_fn=lambda m: 0,
            **EXECUTORS,
        )


def test_max_time_and_max_events() -> None:
    link = Link(1e6, rtt_s=0.1)
    with pytest.raises(SimulationTimeout, match="max_time=1"):
        simulate(
            PingEdge(10**9, 8),
            PongCloud(8),
            link,
            LINEAR,
            LINEAR,
            size_fn=toy_bits,
            **EXECUTORS,
            max_time=1.0,
        )
    zero = Link(math.inf, rtt_s=0.0)
    with pytest.raises(SimulationTimeout, match="max_events=500"):
        simulate(
            PingEdge(10**9, 8),
            PongCloud(8),
            zero,
            LINEAR,
            LINEAR,
            size_fn=toy_bits,
            **EXECUTORS,
            max_events=500,
        )


def test_identical_seeds_give_identical_runs() -> None:
    def run(seed: int):
        link = Link(1e6, rtt_s=0.05, jitter_s=0.02, loss=0.1, seed=seed)
        return simulate(
            DraftEdge(30, 3, 4000),
            VerifyCloud(3, 9000),
            link,
            LINEAR,
            LINEAR,
            size_fn=toy_bits,
            **EXECUTORS,
            trace=True,
        )

    a, b, c = run(1), run(1), run(2)
    assert a.trace == b.trace and a.emits == b.emits and a.duration_s == b.duration_s
    assert a.duration_s != c.duration_s
    assert a.retransmissions["up"] + a.retransmissions["down"] > 0


def test_measured_profile_charges_real_run_time() -> None:
    """The job's own wall time: at least its 30 ms sleep, at most the whole simulation's."""

    def slow():
        time.sleep(0.03)
        return 1

    journal: list = []
    edge = Scripted("edge", [Compute(0, Thunk(ComputeCost("cpu"), slow))], journal)
    edge.handle = lambda ev: (
        [Compute(0, Thunk(ComputeCost("cpu"), slow))] if isinstance(ev, Start) else [Finish("x")]
    )
    began = time.perf_counter()
    res = simulate(
        edge,
        Scripted("cloud", [], journal),
        Link(1e6, 0.0),
        "measured",
        LINEAR,
        size_fn=toy_bits,
        **EXECUTORS,
    )
    took = time.perf_counter() - began
    assert 0.03 <= res.duration_s <= took
    assert res.compute_busy_s["edge"] == res.duration_s


def test_bad_machines_and_actions_are_reported() -> None:
    journal: list = []
    link = Link(1e6, 0.0)
    bad_action = Scripted("edge", ["not an action"], journal)
    with pytest.raises(TypeError, match="unknown action"):
        simulate(
            bad_action,
            Scripted("cloud", [], journal),
            link,
            LINEAR,
            LINEAR,
            size_fn=toy_bits,
            **EXECUTORS,
        )
    no_list = Scripted("edge", [], journal)
    no_list.handle = lambda ev: None
    with pytest.raises(TypeError, match="must return a list"):
        simulate(
            no_list,
            Scripted("cloud", [], journal),
            link,
            LINEAR,
            LINEAR,
            size_fn=toy_bits,
            **EXECUTORS,
        )
    sender = Scripted("edge", [Send(Ping(0, 8))], journal)
    with pytest.raises(ValueError, match=r"size_fn gave 1\.5"):
        simulate(
            sender,
            Scripted("cloud", [], journal),
            link,
            LINEAR,
            LINEAR,
            size_fn=lambda m: 1.5,
            **EXECUTORS,
        )
    with pytest.raises(TypeError, match="no handle"):
        simulate(object(), Scripted("cloud", [], journal), link, LINEAR, LINEAR, **EXECUTORS)


def test_errors_inside_machines_carry_the_virtual_time() -> None:
    def boom():
        raise RuntimeError("model exploded")

    journal: list = []
    edge = Scripted("edge", [Compute(7, Thunk(ComputeCost("cpu"), boom), "x")], journal)
    with pytest.raises(RuntimeError, match="model exploded") as info:
        simulate(
            edge,
            Scripted("cloud", [], journal),
            Link(1e6, 0.0),
            LINEAR,
            LINEAR,
            size_fn=toy_bits,
            **EXECUTORS,
        )
    assert any("edge compute x #7 at t=0" in note for note in info.value.__notes__)


def test_default_message_size_is_the_exact_wire_encoding() -> None:
    from wanspec import wire

    draft = wire.Draft(round=0, base=0, tokens=(5, 300, 70_000), probs=(65535, 123, 9))

    class Edge:
        def handle(self, event):
            return [Send(draft)] if isinstance(event, Start) else [Finish("done")]

    class Cloud:
        def handle(self, event):
            return [Send(wire.Close("bye"))] if isinstance(event, MessageReceived) else []

    res = simulate(Edge(), Cloud(), Link(1e4, rtt_s=0.0), LINEAR, LINEAR, **EXECUTORS)
    up, down = 8 * len(wire.encode(draft)), 8 * len(wire.encode(wire.Close("bye")))
    assert res.bits == {"up": up, "down": down}
    assert res.duration_s == pytest.approx((up + down) / 1e4)


def test_cancel_drops_a_queued_job_and_the_result_of_a_running_one() -> None:
    ran: list[str] = []
    journal: list = []

    def job(name: str, n: int) -> Thunk:
        return Thunk(ComputeCost("forward", n=n), lambda: ran.append(name) or name)

    class Canceller:
        side = "edge"

        def handle(self, event):
            journal.append(event)
            if isinstance(event, Start):  # 0 starts at once; 1, 2 and 3 wait in line
                jobs = [Compute(k, job(f"j{k}", 1 + (k == 3))) for k in range(4)]
                return [*jobs, Cancel(1), Send(Ping(0, 8))]
            if isinstance(event, MessageReceived):  # the pong arrives while j0 runs
                return [Cancel(0)]
            if isinstance(event, ComputeDone) and event.job_id == 3:
                return [Finish("done")]
            return []

    res = simulate(
        Canceller(), PongCloud(8), Link(1e6, 0.0), LINEAR, LINEAR,
        size_fn=toy_bits, trace=True, **EXECUTORS,
    )  # fmt: skip
    assert ran == ["j0", "j2", "j3"]  # j1 never ran; j0 was running when cancelled
    delivered = [e.job_id for e in journal if isinstance(e, ComputeDone)]
    assert delivered == [2, 3]  # j0's result was dropped
    assert res.computes["edge"] == 3
    assert res.duration_s == pytest.approx(0.010 + 0.010 + 0.012)
