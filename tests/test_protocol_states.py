"""Machines name what they compute and what phase they are in.

Purposes: every job a protocol machine asks for carries a `Purpose` member, never a bare string
(drivers, stats and metrics tally by it, and a string equal to a member would slip past every
test that compares tallies), checked in the source and on a run of every method. States: the
edge before the cloud's HelloAck, a pipeline stalled on its own tree and a split cloud before
the prompt's activations are states of their machines, each with an `EXPECTS` entry that refuses
what the neighbouring phase would take, with PROTOCOL and a reason naming the state.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wanspec.protocols
from wanspec import wire
from wanspec.models.jobs import session_executor
from wanspec.protocols.base import (
    PROTOCOL_VERSION,
    Compute,
    ComputeDone,
    ErrorCode,
    MessageReceived,
    Purpose,
    Send,
    Start,
)
from wanspec.protocols.pipeline import PipelineEdge
from wanspec.protocols.registry import METHODS, edge_fingerprints, make_cloud
from wanspec.protocols.speculative import EdgeState, SpecEdge
from wanspec.protocols.stream import StreamEdge, StreamState
from wanspec.sampling.logits import TorchLogitRows
from wanspec.sim import Link, simulate
from worlds import FLAT_PROFILE, World, deliver, refusal

GAMMA = 3
HIDDEN = 8  # the split tests' activation width
PROTOCOLS = Path(wanspec.protocols.__file__).parent


# ============================================================================ purposes


def _is_purpose(node: ast.expr) -> bool:
    """`Purpose.<member>` in the source."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Purpose"
        and node.attr in Purpose.__members__
    )


def _written_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of the source as written: under `make mutate` the file also holds mutmut's
    copies of each function (names with `__mutmut_`), whose mutants misuse purposes on purpose."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _purpose_misuses(tree: ast.AST) -> list[str]:
    """Every `.compute(…)` whose purpose is not `Purpose.<member>`, and every comparison of a
    `purpose` with anything but a member or None (a string literal would still compare equal)."""
    bad = []
    for node in _written_nodes(tree):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if call and node.func.attr == "compute" and not (node.args and _is_purpose(node.args[0])):
            bad.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [s for s in sides if isinstance(s, ast.Name) and s.id == "purpose"]
            others = [s for s in sides if s not in named]
            allowed = [s for s in others if _is_purpose(s) or ast.unparse(s) == "None"]
            if named and allowed != others:
                bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    return bad


def test_the_protocol_source_names_every_purpose_by_its_member() -> None:
    files = sorted(PROTOCOLS.glob("*.py"))
    assert len(files) > 5
    bad = {f.name: _purpose_misuses(ast.parse(f.read_text())) for f in files}
    assert {name: lines for name, lines in bad.items() if lines} == {}


class _Recorder:
    """A machine as a driver sees it, noting the label of every job it asks for."""

    def __init__(self, machine: Any) -> None:
        self.machine, self.side, self.labels = machine, machine.side, []

    def handle(self, event: Any) -> list[Any]:
        actions = self.machine.handle(event)
        self.labels += [a.label for a in actions if isinstance(a, Compute)]
        return actions

    def __getattr__(self, name: str) -> Any:
        """The wrapped machine's own attributes (an edge's method, which picks its model)."""
        return getattr(self.machine, name)


def _split_run(world: World) -> tuple[_Recorder, _Recorder]:
    """Split inference on stand-in layers: zero activations up, flat logits down."""
    info = dataclasses.replace(world.info, accepts_activations=True, hidden_size=HIDDEN)
    edge = world.edge("split", max_new_tokens=4, seed=1)
    width = world.alignment.target_width
    machines = _Recorder(edge), _Recorder(make_cloud(info))
    simulate(
        *machines,
        Link(bandwidth_bps=1e6, rtt_s=0.02),
        FLAT_PROFILE,
        FLAT_PROFILE,
        edge_executor=lambda job: np.zeros((len(job.ids), HIDDEN), dtype=np.float32),
        cloud_executor=lambda job: TorchLogitRows(torch.zeros((1, width))),
    )
    return machines


def _labels(world: World, method: str) -> list[Any]:
    """The labels of every job both sides of one run of `method` asked for."""
    if METHODS[method].family == "split":
        edge, cloud = _split_run(world)
    else:
        edge, cloud = (_Recorder(m) for m in world.machines(method, max_new_tokens=12, seed=3))
        world.simulate(edge, cloud)
    return edge.labels + cloud.labels


def test_every_job_of_every_method_is_labelled_with_a_purpose(shared_world: World) -> None:
    """`type(...) is Purpose`, not `in Purpose`: a bare "verify" equals Purpose.VERIFY."""
    seen: set[Purpose] = set()
    for method in METHODS:
        labels = _labels(shared_world, method)
        strays = sorted({repr(x) for x in labels if type(x) is not Purpose})
        assert labels and strays == [], (method, strays)
        seen.update(labels)
    assert seen == set(Purpose)  # and every purpose is one some machine asks for


# ============================================================================ states


def _ack(edge: Any) -> wire.HelloAck:
    fp = edge.fingerprints
    return wire.HelloAck(PROTOCOL_VERSION, fp.target_model, fp.target_tokenizer, {})


def _draft_up(edge: Any, actions: list[Any], execute: Any) -> list[Any]:
    """Run the edge's draft jobs until its chain is sent; the actions that sent it."""
    while not any(isinstance(a, Send) and isinstance(a.msg, wire.Draft) for a in actions):
        job = next(a for a in actions if isinstance(a, Compute))
        actions = edge.handle(ComputeDone(job.job_id, execute(job.job)))
    return actions


def test_each_state_before_the_hello_ack_accepts_the_ack_and_nothing_else() -> None:
    for machine in (StreamEdge, SpecEdge, PipelineEdge):
        assert machine.OPENING, machine
        for twin in machine.OPENING.values():
            assert machine.EXPECTS[twin] == (wire.HelloAck,), (machine, twin)
        assert all(wire.HelloAck not in machine.EXPECTS.get(s, ()) for s in machine.OPENING)


def test_a_streaming_edge_refuses_tokens_before_the_hello_ack(shared_world: World) -> None:
    edge = shared_world.edge("ar", max_new_tokens=4)
    edge.handle(Start())
    assert edge.state == StreamState.OPENING
    reason = "unexpected Tokens while opening"
    assert refusal(deliver(edge, wire.Tokens((5,)))) == (ErrorCode.PROTOCOL, reason)
    edge = shared_world.edge("ar", max_new_tokens=4)
    edge.handle(Start())
    assert deliver(edge, _ack(edge)) == [] and edge.state == StreamState.STREAMING


def test_a_drafting_edge_refuses_a_verdict_before_the_hello_ack(shared_world: World) -> None:
    edge = shared_world.edge("naive", max_new_tokens=20, gamma=GAMMA, seed=4)
    edge.handle(Start())
    assert edge.state == EdgeState.OPENING_DRAFTING
    reason = "unexpected VerifyResult while opening_drafting"
    verdict = wire.VerifyResult(0, 0, token=1)
    assert refusal(deliver(edge, verdict)) == (ErrorCode.PROTOCOL, reason)


def test_an_edge_with_its_draft_up_refuses_a_verdict_before_the_hello_ack(
    shared_world: World,
) -> None:
    """The chain may go up before the ack is in: the edge then waits for both, the ack first,
    and the ack leaves it WAITING for the verdict."""

    def drafted() -> SpecEdge:
        edge = shared_world.edge("naive", max_new_tokens=20, gamma=GAMMA, seed=4)
        _draft_up(edge, edge.handle(Start()), session_executor(shared_world.draft))
        assert edge.state == EdgeState.OPENING_WAITING
        return edge

    verdict = wire.VerifyResult(0, GAMMA, token=1)
    reason = "unexpected VerifyResult while opening_waiting"
    assert refusal(deliver(drafted(), verdict)) == (ErrorCode.PROTOCOL, reason)
    edge = drafted()
    assert deliver(edge, _ack(edge)) == [] and edge.state == EdgeState.WAITING
    assert edge.handle(MessageReceived(verdict))[0].token_ids[-1] == 1  # committed
    assert edge.state == EdgeState.DRAFTING


def _picospec_stalled(world: World) -> tuple[PipelineEdge, Compute, Any]:
    """A PicoSpec edge whose chain is all accepted before its tree pass is back: it stalls on
    the continuation. Returns it, its outstanding tree job and its draft session's executor."""
    edge = world.edge("picospec", max_new_tokens=20, gamma=GAMMA, seed=4)
    actions = edge.handle(Start())
    assert deliver(edge, _ack(edge)) == []
    execute = session_executor(world.draft)
    (tree,) = [a for a in _draft_up(edge, actions, execute) if isinstance(a, Compute)]
    assert tree.label == Purpose.TREE
    assert [type(a).__name__ for a in deliver(edge, wire.VerifyResult(0, GAMMA))] == ["Emit"]
    assert edge.state == EdgeState.STALLED and edge.counters["pipeline_stalls"] == 1
    return edge, tree, execute


@pytest.mark.parametrize(
    "late",
    [wire.VerifyResult(0, GAMMA), wire.Candidates(0, ((5, 0.5),))],
    ids=lambda m: type(m).__name__,
)
def test_a_stalled_pipeline_refuses_what_waiting_or_resolving_would_take(
    shared_world: World, late: Any
) -> None:
    """A stall waits for the edge's own tree, not for the cloud, which has answered."""
    edge, _, _ = _picospec_stalled(shared_world)
    reason = f"unexpected {type(late).__name__} while stalled"
    assert refusal(deliver(edge, late)) == (ErrorCode.PROTOCOL, reason)


def test_a_stall_ends_when_the_branch_is_drafted_and_the_next_chain_goes_up(
    shared_world: World,
) -> None:
    edge, job, execute = _picospec_stalled(shared_world)
    while edge.state == EdgeState.STALLED:
        assert job.label == Purpose.TREE
        actions = edge.handle(ComputeDone(job.job_id, execute(job.job)))
        job = next(a for a in actions if isinstance(a, Compute))
    assert edge.state == EdgeState.WAITING and edge.counters["cache_hits"] == 1
    assert [a.msg.round for a in actions if isinstance(a, Send)] == [1]  # the next chain


def test_a_split_cloud_refuses_tokens_before_the_prompts_activations(
    shared_world: World,
) -> None:
    info = dataclasses.replace(shared_world.info, accepts_activations=True, hidden_size=HIDDEN)
    fp = edge_fingerprints(shared_world.alignment, shared_world.target.fingerprint)
    hello = wire.Hello(
        PROTOCOL_VERSION, "edge", "split", fp.target_model, fp.target_tokenizer, fp.draft_tokenizer
    )

    def ready() -> Any:
        cloud = make_cloud(info)
        deliver(cloud, hello)
        assert deliver(cloud, wire.StartRequest(0, "", {"max_new_tokens": 4})) == []
        assert cloud.inner.state == StreamState.AWAIT_PROMPT
        return cloud

    reason = "unexpected Tokens while await_prompt"
    assert refusal(deliver(ready(), wire.Tokens((5,)))) == (ErrorCode.PROTOCOL, reason)
    cloud = ready()
    prompt = wire.HiddenStates(1, torch.zeros((3, HIDDEN), dtype=torch.float16).numpy())
    (forward,) = deliver(cloud, prompt)
    assert forward.label == Purpose.FORWARD and cloud.inner.state == StreamState.STREAMING
    assert cloud.cache_tokens == 3 + 4
