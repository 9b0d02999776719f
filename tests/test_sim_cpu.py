"""The simulator charging the machines' own CPU (`simulate(..., charge_cpu=True)`).

A wrapper makes each `handle()` slow on purpose (it sleeps) and records how long each call took
on the wall clock; every bound below is built from those readings, so a slower machine only
moves both sides of a comparison."""

from __future__ import annotations

import itertools
import json
import pickle
import time
from typing import Any

import pytest
from click.testing import CliRunner

import wanspec
from test_sim import (
    EXECUTORS,
    DraftEdge,
    Ping,
    PingEdge,
    PongCloud,
    VerifyCloud,
    flat,
    toy_bits,
)
from wanspec.cli import main
from wanspec.models.jobs import session_executor
from wanspec.models.synthetic import SyntheticLM, SyntheticSpec
from wanspec.models.tiny import build_tokenizer
from wanspec.protocols.base import Finish, Send, Start
from wanspec.protocols.registry import build_machines
from wanspec.protocols.settings import GenerationSettings
from wanspec.sim import EdgeSession, Link, SimResult, request, simulate, simulate_many
from wanspec.vocab import VocabAlignment

SLEEP_S = 0.004
SLACK = 1.5  # the driver's reading of a call encloses the wrapper's, plus a few calls' overhead
LINK = Link(bandwidth_bps=1e6, rtt_s=0.05)


class Slow:
    """A machine whose every `handle()` first sleeps `sleep_s`; `calls` holds (event type,
    wall seconds of the whole call) in order."""

    def __init__(self, machine: Any, sleep_s: float = SLEEP_S) -> None:
        self.machine, self.sleep_s = machine, sleep_s
        self.calls: list[tuple[str, float]] = []

    def handle(self, event: Any) -> Any:
        began = time.perf_counter()
        time.sleep(self.sleep_s)
        actions = self.machine.handle(event)
        self.calls.append((type(event).__name__, time.perf_counter() - began))
        return actions

    def __getattr__(self, name: str) -> Any:
        return getattr(self.machine, name)

    def seconds(self, kind: str | None = None) -> float:
        return sum(s for k, s in self.calls if kind is None or k == kind)


def ping_pong(slow: bool, charge: bool, rounds: int = 6, trace: bool = True) -> Any:
    edge, cloud = PingEdge(rounds, bits=2000), PongCloud(bits=8000)
    if slow:
        edge, cloud = Slow(edge), Slow(cloud)
    res = simulate(
        edge,
        cloud,
        LINK,
        flat(1.0),
        flat(1.0),
        size_fn=toy_bits,
        trace=trace,
        charge_cpu=charge,
        **EXECUTORS,
    )
    return res, edge, cloud


def timeline(res: SimResult) -> list[tuple[float, str, str]]:
    assert res.trace is not None
    return [(r.t, r.side, r.what) for r in res.trace]


def test_off_a_slow_handler_changes_no_virtual_time_and_no_token() -> None:
    fast, _, _ = ping_pong(slow=False, charge=False)
    slow, edge, _ = ping_pong(slow=True, charge=False)
    assert edge.seconds() >= 7 * SLEEP_S  # the handlers really were slow
    assert slow.duration_s == fast.duration_s
    assert slow.emits == fast.emits and slow.tokens == fast.tokens == list(range(6))
    assert timeline(slow) == timeline(fast)
    assert slow.protocol_cpu_s is None and slow.codec_cpu_s is None


def test_on_the_run_ends_later_by_the_handlers_on_its_critical_path() -> None:
    base, _, _ = ping_pong(slow=False, charge=False)
    res, edge, cloud = ping_pong(slow=True, charge=True)
    assert res.tokens == base.tokens and res.bits == base.bits
    # Every event but the cloud's Start is on the critical path: the edge's Start sends the
    # first Ping, each Ping's handler sends its Pong, each Pong's handler the next Ping.
    critical = edge.seconds() + cloud.seconds("MessageReceived")
    assert len(edge.calls) == 7 and len(cloud.calls) == 7
    extra = res.duration_s - base.duration_s
    assert critical - 1e-9 <= extra <= SLACK * critical
    # the k-th emit comes after the edge's Start, k + 1 Pongs' and Pings' handlers
    edge_s = [s for _, s in edge.calls]
    cloud_s = [s for k, s in cloud.calls if k == "MessageReceived"]
    for k, (rec, fast) in enumerate(zip(res.emits, base.emits, strict=True)):
        before = sum(edge_s[: k + 2]) + sum(cloud_s[: k + 1])
        assert before - 1e-9 <= rec.t - fast.t <= SLACK * before
    # what was charged is reported, per side
    assert res.protocol_cpu_s is not None and res.codec_cpu_s == {"edge": 0.0, "cloud": 0.0}
    for side, machine in (("edge", edge), ("cloud", cloud)):
        assert machine.seconds() <= res.protocol_cpu_s[side] <= SLACK * machine.seconds()


def test_a_job_queued_by_a_slow_handler_starts_when_the_handler_ends() -> None:
    gamma, rounds = 3, 3
    edge, cloud = Slow(DraftEdge(rounds, gamma, bits=1000)), Slow(VerifyCloud(gamma, bits=3000))
    res = simulate(
        edge, cloud, LINK, flat(5.0), flat(5.0), size_fn=toy_bits, trace=True, charge_cpu=True,
        **EXECUTORS,
    )  # fmt: skip
    assert res.trace is not None
    starts = [r.t for r in res.trace if r.side == "edge" and r.what == "compute_start"]
    assert starts[0] >= edge.calls[0][1]  # queued by the edge's Start handler, at t = 0
    # each cloud verification starts once the handler of the draft that asked for it is over
    cloud_steps = [
        r for r in res.trace if r.side == "cloud" and r.what in ("recv", "compute_start")
    ]
    handled = [s for k, s in cloud.calls if k == "MessageReceived"]
    pairs = list(zip(cloud_steps[::2], cloud_steps[1::2], strict=True))
    assert len(pairs) == rounds == len(handled)
    for (recv, start), seconds in zip(pairs, handled, strict=True):
        assert (recv.what, start.what) == ("recv", "compute_start")
        assert seconds - 1e-9 <= start.t - recv.t <= SLACK * seconds


class TwoPings:
    """Sends two Pings at once and finishes on the second Pong."""

    side = "edge"

    def handle(self, event: Any) -> list[Any]:
        if isinstance(event, Start):
            return [Send(Ping(0, 100)), Send(Ping(1, 100))]
        return [Finish("length")] if event.msg.k == 1 else []


def test_a_side_handles_one_event_at_a_time() -> None:
    cloud = Slow(PongCloud(bits=100))
    link = Link(bandwidth_bps=float("inf"), rtt_s=0.02)  # both Pings arrive at once
    res = simulate(
        TwoPings(), cloud, link, flat(1.0), flat(1.0), size_fn=toy_bits, trace=True,
        charge_cpu=True, **EXECUTORS,
    )  # fmt: skip
    assert res.trace is not None
    recvs = [r.t for r in res.trace if r.side == "cloud" and r.what == "recv"]
    sends = [r.t for r in res.trace if r.side == "cloud" and r.what == "send"]
    (_, _start_s), (_, first_s), (_, second_s) = cloud.calls
    assert recvs[0] >= 0.01  # one way; the cloud's Start handler was over by then or delays it
    assert recvs[1] >= sends[0] >= recvs[0] + first_s - 1e-9  # the second Ping waited
    assert sends[1] - recvs[1] >= second_s - 1e-9
    assert res.duration_s >= 0.02 + first_s + second_s


def test_many_sessions_share_the_servers_one_cpu() -> None:
    clouds = [Slow(PongCloud(bits=100)) for _ in range(2)]
    sessions = [
        EdgeSession(PingEdge(4, 100), cloud, LINK, *EXECUTORS.values(), flat(1.0))
        for cloud in clouds
    ]
    run = simulate_many(sessions, flat(1.0), size_fn=toy_bits, trace=True, charge_cpu=True)
    spans = []  # each cloud handler's [start, end]: a recv to the send it answers with
    for res in run.sessions:
        assert res.trace is not None and res.protocol_cpu_s is not None
        steps = [r for r in res.trace if r.side == "cloud" and r.what in ("recv", "send")]
        spans += [(a.t, b.t) for a, b in zip(steps[::2], steps[1::2], strict=True)]
    spans.sort()
    assert len(spans) == 8
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 1e-12  # never two handlers at once, across sessions
    for res, cloud in zip(run.sessions, clouds, strict=True):
        assert cloud.seconds() <= res.protocol_cpu_s["cloud"] <= SLACK * cloud.seconds()
    alone = EdgeSession(PingEdge(4, 100), PongCloud(100), LINK, *EXECUTORS.values(), flat(1.0))
    assert run.end_s > simulate_many([alone], flat(1.0), size_fn=toy_bits).end_s


# ============================================================================ real machines


@pytest.fixture(scope="module")
def pair() -> tuple[VocabAlignment, SyntheticLM, SyntheticLM]:
    alignment = VocabAlignment.identity(build_tokenizer("bytelevel", 300))
    spec = SyntheticSpec(0.7, vocab_size=alignment.target_width, seed=5)
    return alignment, SyntheticLM(spec, "draft"), SyntheticLM(spec, "target")


def _run(pair: Any, method: str, charge: bool, slow: bool = False) -> tuple[SimResult, Any]:
    alignment, draft, target = pair
    edge, cloud = build_machines(
        method,
        draft_lm=draft,
        target_lm=target,
        alignment=alignment,
        draft_encode=lambda _: [7, 8, 9],
        target_encode=lambda _: [7, 8, 9],
        target_decode=lambda ids: "",
        prompt="",
        settings=GenerationSettings(gamma=4, max_new_tokens=24, seed=3, temperature=1.0),
    )
    if slow:
        edge = Slow(edge)
    res = simulate(
        edge,
        cloud,
        LINK,
        "edge-orin",
        "cloud-a100-8b",
        edge_executor=session_executor(draft),
        cloud_executor=session_executor(target),
        charge_cpu=charge,
    )
    return res, edge


@pytest.mark.parametrize("method", ["cosd", "acespec"])
def test_real_machines_are_charged_their_handlers_and_codec(pair, method: str) -> None:
    off, _ = _run(pair, method, charge=False)
    again, _ = _run(pair, method, charge=False)
    slow_off, _ = _run(pair, method, charge=False, slow=True)
    on, _ = _run(pair, method, charge=True)
    assert again.duration_s == off.duration_s == slow_off.duration_s  # off: deterministic
    assert again.emits == off.emits == slow_off.emits
    assert on.tokens == off.tokens and on.bits == off.bits
    assert on.duration_s > off.duration_s
    assert on.protocol_cpu_s is not None and on.codec_cpu_s is not None
    for side in ("edge", "cloud"):
        assert 0 < on.codec_cpu_s[side] < on.protocol_cpu_s[side]
    # with the edge slowed on purpose, it is charged at least every sleep
    slow_on, edge = _run(pair, method, charge=True, slow=True)
    assert slow_on.tokens == off.tokens
    assert slow_on.protocol_cpu_s is not None
    assert slow_on.protocol_cpu_s["edge"] >= edge.seconds() >= len(edge.calls) * SLEEP_S
    assert (
        slow_on.duration_s
        > off.duration_s + SLEEP_S * sum(k == "MessageReceived" for k, _ in edge.calls) / 2
    )  # at least half of the edge's message handlers are on the critical path


def test_generate_and_the_cli_report_the_charged_cpu(tiny_pair_hetero) -> None:
    draft, target = tiny_pair_hetero
    pair = wanspec.load_pair(target=str(target), draft=str(draft))
    kwargs = {"max_new_tokens": 6, "temperature": 0.0, "edge_profile": "edge-orin"}
    off = wanspec.generate(pair, "hello", "xcosd", cloud_profile="cloud-a100-8b", **kwargs)
    on = wanspec.generate(
        pair, "hello", "xcosd", cloud_profile="cloud-a100-8b", charge_protocol_cpu=True, **kwargs
    )
    assert on.token_ids == off.token_ids
    assert "protocol_cpu_s" not in off.stats
    assert set(on.stats["protocol_cpu_s"]) == {"edge", "cloud"}
    assert all(s > 0 for s in on.stats["protocol_cpu_s"].values())
    assert all(s > 0 for s in on.stats["codec_cpu_s"].values())
    assert on.stats["time_s"] > off.stats["time_s"]
    args = ["generate", "--target", str(target), "--draft", str(draft), "--method", "xcosd"]
    args += ["--prompt", "hello", "--max-new-tokens", "4", "--temperature", "0", "--json"]
    args += ["--edge-profile", "edge-orin", "--cloud-profile", "cloud-a100-8b"]
    plain = CliRunner().invoke(main, args)
    charged = CliRunner().invoke(main, [*args, "--charge-protocol-cpu"])
    assert plain.exit_code == 0 and charged.exit_code == 0, (plain.output, charged.output)
    stats = json.loads(charged.output)["stats"]
    assert stats["protocol_cpu_s"]["cloud"] > 0 and stats["codec_cpu_s"]["edge"] > 0
    assert "protocol_cpu_s" not in json.loads(plain.output)["stats"]
    assert json.loads(plain.output)["token_ids"] == json.loads(charged.output)["token_ids"]


class SlowCodec:
    """Pickle, with every encode and decode sleeping first; records (message type, seconds)."""

    def __init__(self, sleep_s: float = SLEEP_S) -> None:
        self.sleep_s = sleep_s
        self.encodes: list[tuple[str, float]] = []
        self.decodes: list[tuple[str, float]] = []

    def encode(self, msg: Any) -> bytes:
        began = time.perf_counter()
        time.sleep(self.sleep_s)
        data = pickle.dumps(msg)
        self.encodes.append((type(msg).__name__, time.perf_counter() - began))
        return data

    def decode(self, data: bytes) -> Any:
        began = time.perf_counter()
        time.sleep(self.sleep_s)
        msg = pickle.loads(data)
        self.decodes.append((type(msg).__name__, time.perf_counter() - began))
        return msg


def test_the_sender_pays_the_encoding_and_the_receiver_the_decoding(monkeypatch) -> None:
    def run(charge: bool) -> SimResult:
        return simulate(
            PingEdge(3, 2000), PongCloud(8000), LINK, flat(1.0), flat(1.0), trace=True,
            charge_cpu=charge, **EXECUTORS,
        )  # fmt: skip

    plain = (pickle.dumps, pickle.loads)
    monkeypatch.setattr(request, "_wire_codec", lambda: plain)
    base = run(charge=False)  # the same message sizes, nothing charged
    codec = SlowCodec()
    monkeypatch.setattr(request, "_wire_codec", lambda: (codec.encode, codec.decode))
    res = run(charge=True)
    assert res.tokens == base.tokens == [0, 1, 2] and len(codec.encodes) == 6

    def paid(table: list[tuple[str, float]], kind: str) -> float:
        return sum(s for k, s in table if k == kind)

    charged = {
        "edge": paid(codec.encodes, "Ping") + paid(codec.decodes, "Pong"),
        "cloud": paid(codec.encodes, "Pong") + paid(codec.decodes, "Ping"),
    }
    assert res.codec_cpu_s is not None and res.protocol_cpu_s is not None
    for side, seconds in charged.items():
        assert seconds <= res.codec_cpu_s[side] <= res.protocol_cpu_s[side] <= SLACK * seconds
    # every encode and decode is on the critical path of a ping-pong
    extra, codec_s = res.duration_s - base.duration_s, sum(charged.values())
    assert codec_s - 1e-9 <= extra <= SLACK * codec_s
    assert res.trace is not None
    first_send = next(r for r in res.trace if r.what == "send")
    assert first_send.side == "edge" and first_send.t >= codec.encodes[0][1]  # sent once encoded


def test_many_sessions_charged_keep_their_tokens(pair) -> None:
    alignment, draft, target = pair

    def session(i: int, method: str) -> EdgeSession:
        edge, cloud = build_machines(
            method,
            draft_lm=draft,
            target_lm=target,
            alignment=alignment,
            draft_encode=lambda _: [7, 8, 9 + i],
            target_encode=lambda _: [7, 8, 9 + i],
            target_decode=lambda ids: "",
            prompt="",
            settings=GenerationSettings(gamma=4, max_new_tokens=16, seed=i, temperature=1.0),
        )
        executors = (session_executor(draft), session_executor(target))
        return EdgeSession(edge, cloud, LINK, *executors, "edge-orin", 0.01 * i)

    methods = ["cosd", "acespec", "ar"]
    plain = simulate_many([session(i, m) for i, m in enumerate(methods)], "cloud-a100-8b")
    charged = simulate_many(
        [session(i, m) for i, m in enumerate(methods)], "cloud-a100-8b", charge_cpu=True
    )
    for off, on in zip(plain.sessions, charged.sessions, strict=True):
        assert on.tokens == off.tokens and on.finish_reason == off.finish_reason == "length"
        assert off.protocol_cpu_s is None and on.protocol_cpu_s is not None
        assert on.protocol_cpu_s["cloud"] > 0 and on.protocol_cpu_s["edge"] > 0
    # the CPU charged moves the timeline (not always later at the end: batches may regroup)
    assert charged.end_s != plain.end_s
