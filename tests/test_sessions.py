"""One loaded model, many KV-cache sessions: requests interleaved job by job stay independent."""

from __future__ import annotations

from collections import deque

import pytest
import torch

import wanspec
from wanspec import wire
from wanspec.jobs import Forward
from wanspec.models.jobs import run_job, session_executor
from wanspec.models.lm import load_model
from wanspec.protocols.base import Compute, ComputeDone, Emit, Finish, MessageReceived, Send, Start
from wanspec.protocols.registry import make_cloud, make_edge
from wanspec.protocols.settings import GenerationSettings


def test_sessions_share_weights_but_not_caches(tiny_models) -> None:
    lm = load_model(tiny_models["qwen2"])
    a, b = lm.new_session(), lm.new_session()
    assert a.model is b.model is lm.model
    alone = run_job(lm.new_session(), Forward(0, (5, 6, 7), rows=3)).block
    run_job(a, Forward(0, (5, 6), rows=1))
    run_job(b, Forward(0, (9, 9, 9, 9), rows=1))  # must not disturb a
    last = run_job(a, Forward(2, (7,), rows=1)).block
    assert (a.length, b.length) == (3, 4)
    torch.testing.assert_close(last[0], alone[2], rtol=1e-5, atol=1e-5)


def _interleaved(pair: wanspec.Pair, requests: list[dict]) -> list[list[int]]:
    """Run several requests at once against ONE loaded target (one session each), stepping
    their events round-robin so their jobs interleave on the shared weights."""
    runs = []
    for req in requests:
        settings = GenerationSettings(**req["settings"])
        edge = make_edge(
            req["method"],
            alignment=pair.alignment,
            prompt=req["prompt"],
            settings=settings,
            draft_encode=pair.draft_encode,
            target_decode=pair.decode,
            target_encode=pair.target_encode,
        )
        sides = {
            "edge": (edge, session_executor(pair.draft)),
            "cloud": (make_cloud(pair.cloud_info), session_executor(pair.target)),
        }
        runs.append({"sides": sides, "queue": deque([("cloud", Start()), ("edge", Start())]),
                     "tokens": [], "done": False})  # fmt: skip
    for _ in range(10_000):
        live = [r for r in runs if not r["done"] and r["queue"]]
        if not live:
            break
        for run in live:
            side, event = run["queue"].popleft()
            machine, execute = run["sides"][side]
            for action in machine.handle(event):
                if isinstance(action, Send):
                    other = "cloud" if side == "edge" else "edge"
                    msg = wire.decode(wire.encode(action.msg))
                    run["queue"].append((other, MessageReceived(msg)))
                elif isinstance(action, Compute):
                    result = execute(action.job)
                    run["queue"].append((side, ComputeDone(action.job_id, result)))
                elif isinstance(action, Emit):
                    run["tokens"] += action.token_ids
                elif isinstance(action, Finish) and side == "edge":
                    run["done"] = True
    assert all(r["done"] for r in runs)
    return [r["tokens"] for r in runs]


@pytest.mark.parametrize("method", ["xcosd-e", "naive", "ar"])
def test_two_cloud_sessions_interleaved_equal_each_alone(tiny_pair_hetero, method: str) -> None:
    draft, target = tiny_pair_hetero
    pair = wanspec.load_pair(target=target, draft=draft)
    requests = [
        {"method": method, "prompt": "hello world",
         "settings": {"max_new_tokens": 10, "temperature": 1.0, "seed": 3, "gamma": 3}},
        {"method": method, "prompt": "a different, longer prompt",
         "settings": {"max_new_tokens": 12, "temperature": 0.0, "seed": 4, "gamma": 2}},
    ]  # fmt: skip
    together = _interleaved(pair, requests)
    alone = [
        wanspec.generate(pair, r["prompt"], r["method"], **r["settings"]).token_ids
        for r in requests
    ]
    assert together == alone
    assert [len(t) for t in together] == [10, 12]
