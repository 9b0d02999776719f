"""A synthetic world for protocol tests: synthetic draft/target LMs with an alignment built from
real tiny tokenizers, run on the simulator with a flat compute profile. Its machines are
assembled as every in-process run's are (`registry.build_machines`, the edge's jobs on
`registry.edge_model_for`), so the tests run what `wanspec.generate` runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wanspec import wire
from wanspec.models.jobs import session_executor
from wanspec.models.synthetic import (  # noqa: F401 - FixedLaw: the tests' import point
    FixedLaw,
    SyntheticLM,
    SyntheticSpec,
    small_residual_laws,
)
from wanspec.models.tiny import build_tokenizer
from wanspec.protocols.base import (
    Compute,
    ComputeDone,
    ErrorCode,
    Finish,
    MessageReceived,
    Send,
    Start,
)
from wanspec.protocols.endpoints import TargetInfo
from wanspec.protocols.registry import build_machines, edge_model_for, target_info
from wanspec.protocols.settings import GenerationSettings
from wanspec.sampling import target_probs
from wanspec.sim import Link, load_profile, simulate
from wanspec.vocab import VocabAlignment

FLAT_PROFILE = load_profile({"name": "flat", "forward_ms": {"1": 1.0, "64": 2.0}})
PROMPT_IDS = [5, 9, 17]
PROMPT = "synthetic"


def prompt_ids(_: str) -> list[int]:
    """Every prompt's ids, on both sides: the synthetic models have no tokenizer."""
    return list(PROMPT_IDS)


def decode_ids(ids: list[int]) -> str:
    """A stand-in for the target's decoder: each id as a word (stop strings match on this)."""
    return " ".join(map(str, ids))


class World:
    """Synthetic draft/target LMs plus an alignment from real tiny tokenizers."""

    def __init__(self, shared: bool) -> None:
        target_tok = build_tokenizer("bytelevel", 300)
        draft_tok = target_tok if shared else build_tokenizer("metaspace", 160)
        self.alignment = VocabAlignment.build(draft_tok, target_tok)
        t_spec = SyntheticSpec(0.6, vocab_size=self.alignment.target_width, seed=1)
        d_spec = (
            t_spec
            if shared
            else SyntheticSpec(
                0.6,
                vocab_size=self.alignment.draft_width,
                seed=2,
                target_support=40,
                draft_extra=40,
            )
        )
        self.target = SyntheticLM(t_spec, "target")
        self.draft = SyntheticLM(d_spec, "draft")

    @property
    def info(self) -> TargetInfo:
        """What the cloud of `machines` knows of this world's target (for clouds built by hand)."""
        return target_info(self.target, prompt_ids, (self.alignment,))

    def with_models(self, target: SyntheticSpec, draft: SyntheticSpec) -> World:
        """This world with other synthetic models (same tokenizers and alignment)."""
        self.target, self.draft = SyntheticLM(target, "target"), SyntheticLM(draft, "draft")
        return self

    def edge(self, method: str, tree_seconds=None, **settings):
        return self.machines(method, tree_seconds, **settings)[0]

    def machines(self, method: str, tree_seconds=None, **settings):
        """Both machines of one request for `method` on this world's models (`tree_seconds`:
        the edge's pass cost per tips, as a latency profile gives it)."""
        return build_machines(
            method,
            tree_seconds=tree_seconds,
            draft_lm=self.draft,
            target_lm=self.target,
            alignment=self.alignment,
            draft_encode=prompt_ids,
            target_encode=prompt_ids,
            target_decode=decode_ids,
            prompt=PROMPT,
            settings=GenerationSettings(**settings),
        )

    def ready_cloud(self, method: str, **settings):
        """A cloud past the handshake and the prefill, waiting for the first draft, and the
        executor of its jobs (tests that hand it drafts one by one)."""
        edge, cloud = self.machines(method, **settings)
        actions = cloud.handle(Start())
        for action in edge.handle(Start()):
            if isinstance(action, Send):
                actions += deliver(cloud, action.msg)
        run = session_executor(self.target)
        for action in actions:
            if isinstance(action, Compute):
                assert cloud.handle(ComputeDone(action.job_id, run(action.job))) == []
        return cloud, run

    def run(
        self,
        method: str,
        link: Link | None = None,
        profile=FLAT_PROFILE,
        trace=False,
        cloud_profile=None,
        tree_seconds=None,
        **settings,
    ):
        edge, cloud = self.machines(method, tree_seconds, **settings)
        return self.simulate(edge, cloud, link, profile, trace, cloud_profile), edge, cloud

    def simulate(
        self,
        edge,
        cloud,
        link: Link | None = None,
        profile=FLAT_PROFILE,
        trace=False,
        cloud_profile=None,
    ):
        """Run two machines on this world's models (fresh sessions) over `link`; the edge's jobs
        run on the model its method's edge runs, priced by `profile` (the cloud's by
        `cloud_profile`, else the same)."""
        edge_model = edge_model_for(edge.method, draft=self.draft, target=self.target)
        return simulate(
            edge,
            cloud,
            link or Link(bandwidth_bps=1e6, rtt_s=0.02),
            profile,
            cloud_profile or profile,
            edge_executor=session_executor(edge_model),
            cloud_executor=session_executor(self.target),
            trace=trace,
        )

    def exact_joint(self, n: int, **sampling) -> dict[tuple[int, ...], float]:
        """The enumerated law of the first n target tokens (the float q, as the target samples)."""
        params = GenerationSettings(**sampling).sampling
        valid = self.alignment.target_valid
        law: dict[tuple[int, ...], float] = {(): 1.0}
        for _ in range(n):
            grown: dict[tuple[int, ...], float] = {}
            for prefix, mass in law.items():
                self.target.reset()
                logits = self.target.extend([*PROMPT_IDS, *prefix])[-1]
                q = target_probs(logits, params, valid)
                for token in np.flatnonzero(q):
                    grown[(*prefix, int(token))] = mass * float(q[token])
            law = grown
        return law


def greedy(world: World, n: int) -> list[int]:
    world.target.reset()
    logits, out = world.target.extend(PROMPT_IDS)[-1], []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = world.target.extend([out[-1]])[-1]
    return out


def deliver(machine: Any, msg: Any) -> list[Any]:
    """Hand a machine a message as a driver would: encoded and decoded by the wire codec."""
    return machine.handle(MessageReceived(wire.decode(wire.encode(msg))))


def refusal(actions: list[Any]) -> tuple[ErrorCode, str]:
    """The Error sent and the Finish reason, which must name the same failure."""
    sent = [a.msg for a in actions if isinstance(a, Send) and isinstance(a.msg, wire.Error)]
    finish = [a.reason for a in actions if isinstance(a, Finish)]
    assert len(sent) == 1 and finish == [f"error: {sent[0].message}"], actions
    return ErrorCode(sent[0].code), sent[0].message


TREE_VARIANTS = [
    dict(tree_budget=1),
    dict(tree_budget=4, tree_allocation="uniform", tree_fixed=True),
    dict(tree_budget=16, tree_allocation="single", tree_fixed=True),
    dict(tree_budget=24, tree_allocation="geometric"),
]


def check_the_tree_never_changes_the_tokens(world: World, **settings: Any) -> list[int]:
    """acespec under every tree variant and a different link each gives picospec's tokens for
    the same settings, and some variant's alternatives were really used (hit rate above
    picospec's); returns those tokens."""
    reference, pico, _ = world.run("picospec", **settings)
    hit_rates = []
    for k, variant in enumerate(TREE_VARIANTS):
        link = Link(bandwidth_bps=1e5 * (k + 1), rtt_s=0.03 * (k + 1), jitter_s=0.01, seed=k)
        sim, edge, _ = world.run("acespec", link=link, **settings, **variant)
        assert sim.tokens == reference.tokens
        hit_rates.append(edge.cache_hit_rate)
    assert max(hit_rates) > pico.cache_hit_rate
    return reference.tokens


def small_residual_world(alpha: float = 0.8) -> World:
    """Two vocabularies and context-free laws whose rejections leave little residual mass
    (`models.synthetic.small_residual_laws`): SR-DV's candidates are often all refused."""
    world = World(shared=False)
    return world.with_models(*small_residual_laws(world.alignment, alpha))


@dataclass
class AheadTally:
    """What chains sent ahead did over several runs: how many were sent and went stale, and the
    most in flight at once. Each run's edge and cloud must agree on the stale ones and on the
    rounds verified."""

    sent: int = 0
    stale: int = 0
    most: int = 0

    def add(self, edge: Any, cloud: Any) -> None:
        stale = edge.counters.get("stale_chains_ahead", 0)
        assert cloud.counters.get("stale_drafts", 0) == stale
        assert len(edge.accepted_per_round) == cloud.counters["rounds"]
        self.sent += edge.counters["chains_sent_ahead"]
        self.stale += stale
        self.most = max(self.most, edge.most_in_flight)

    def check(self, chains: int) -> None:
        assert 0 < self.stale < self.sent  # both outcomes of a chain sent ahead occurred
        assert self.most == chains  # as many chains as allowed were in flight at once
