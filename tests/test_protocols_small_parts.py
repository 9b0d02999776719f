"""Exact checks of the protocol layer's small parts that the end-to-end runs cannot see.

A machine's random streams, its KV-cache plan and its error policy either change no token (a
cache plan that feeds a few tokens too many is only slower) or are patched out by the exact-law
tests (tests/test_protocols_exact_law.py replaces every stream with one enumerator). Each test
here pins one of them exactly; the mutation run (`make mutate`, docs/MUTATION.md) showed each
gap as a surviving mutant.
"""

from __future__ import annotations

import dataclasses
import enum

import pytest

from wanspec import wire
from wanspec.jobs import Forward, TreeForward
from wanspec.models.jobs import run_job, session_executor
from wanspec.protocols.base import (
    Cancel,
    ComputeDone,
    ErrorCode,
    Finish,
    Machine,
    MessageReceived,
    ProtocolError,
    Send,
    Start,
    request_rng,
)
from wanspec.protocols.budget import DEFAULT_POWER_LAW
from wanspec.protocols.cache import CacheMirror
from wanspec.protocols.registry import METHODS, build_machines, make_edge, target_info
from wanspec.protocols.schemes import Ask, Resolved
from wanspec.protocols.settings import GenerationSettings
from wanspec.protocols.stopping import _is_byte_token, matching_mode
from wanspec.protocols.stream import SplitCloud
from wanspec.sampling.draft import draft_row
from wanspec.sim import Link, simulate
from worlds import FLAT_PROFILE, PROMPT_IDS, World

# ----------------------------------------------------------------------------- random streams


def test_edge_and_cloud_streams_are_reproducible_and_independent() -> None:
    """The edge's and the cloud's draws must not be one stream (a shared stream correlates the
    draft with the cloud's coins), and each must follow from the seed alone."""
    draws = {
        (seed, side): request_rng(seed, side).integers(1 << 62, size=4).tolist()
        for seed in (0, 1)
        for side in ("edge", "cloud")
    }
    assert draws[(0, "edge")] == request_rng(0, "edge").integers(1 << 62, size=4).tolist()
    assert len({tuple(v) for v in draws.values()}) == 4


# ----------------------------------------------------------------------------- the cache plan


def test_a_plan_keeps_the_longest_common_prefix_and_feeds_the_rest() -> None:
    cache = CacheMirror()
    assert cache.plan([1, 2, 3]) == Forward(0, (1, 2, 3), 1)
    assert cache.tokens == (1, 2, 3)
    assert cache.plan([1, 2, 3, 4, 5]) == Forward(3, (4, 5), 1)
    assert cache.plan([1, 2, 9, 4]) == Forward(2, (9, 4), 1)  # diverges at the third token
    assert cache.tokens == (1, 2, 9, 4)


def test_a_plan_feeds_at_least_the_rows_it_must_return() -> None:
    """Rows of logits come only from fed tokens: asking for 3 rows of a cached sequence feeds
    its last 3 again, never fewer."""
    cache = CacheMirror()
    cache.plan([1, 2, 3, 4])
    assert cache.plan([1, 2, 3, 4], rows=3) == Forward(1, (2, 3, 4), 3)
    assert cache.plan([1, 2, 3, 4], rows=1) == Forward(3, (4,), 1)
    assert cache.plan([1, 2, 3, 4], rows=4) == Forward(0, (1, 2, 3, 4), 4)


def test_assume_and_forget_after_move_the_picture() -> None:
    cache = CacheMirror()
    cache.plan([1, 2, 3])
    cache.assume([1, 2, 3, 7, 8])
    assert cache.plan([1, 2, 3, 7, 8, 9]) == Forward(5, (9,), 1)
    cache.forget_after(2)
    assert cache.tokens == (1, 2)
    assert cache.plan([1, 2, 3]) == Forward(2, (3,), 1)


@pytest.mark.parametrize(("desired", "rows"), [([1, 2], 0), ([1, 2], 3), ([], 1)])
def test_a_plan_that_cannot_return_its_rows_is_refused(desired: list[int], rows: int) -> None:
    with pytest.raises(ValueError, match=rf"^need at least {rows} token\(s\) to get {rows} row"):
        CacheMirror().plan(desired, rows)


# ----------------------------------------------------------------------------- error policy


class _State(enum.Enum):
    READY = enum.auto()
    DONE = enum.auto()


class _Echo(Machine):
    """A minimal machine: accepts `Close` when ready, runs one job per Start."""

    side = "cloud"
    EXPECTS = {_State.READY: (wire.Close,)}  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__(_State.READY)
        self.results: list[tuple[str, object]] = []

    def on_start(self):
        return [self.compute("work", Forward(0, (1,), 1)), self.compute("more", Forward(0, (2,)))]

    def on_message(self, msg):
        self.count("closes")
        self.count("closes", 2)
        return [Send(msg)]

    def on_compute(self, purpose, result):
        self.results.append((purpose, result))
        return []


def test_jobs_get_fresh_ids_and_results_go_to_their_purpose() -> None:
    machine = _Echo()
    first, second = machine.handle(Start())
    assert (first.job_id, first.label, second.job_id, second.label) == (0, "work", 1, "more")
    assert machine.handle(ComputeDone(1, "r1")) == []
    assert machine.handle(ComputeDone(1, "again")) == []  # answered once only
    assert machine.handle(ComputeDone(7, "unknown")) == []
    assert machine.results == [("more", "r1")]
    assert machine.handle(MessageReceived(wire.Close("x"))) == [Send(wire.Close("x"))]
    assert machine.counters == {"closes": 3}


def test_a_message_out_of_place_is_answered_with_an_error_and_ends_the_machine() -> None:
    machine = _Echo()
    machine.handle(Start())
    actions = machine.handle(MessageReceived(wire.CandidatesRequest(0, 1)))
    text = "unexpected CandidatesRequest while ready"
    assert actions == [
        Send(wire.Error(int(ErrorCode.PROTOCOL), text)),
        Cancel(0),
        Cancel(1),
        Finish(f"error: {text}"),
    ]
    assert machine.done
    assert machine.handle(MessageReceived(wire.Close("late"))) == []
    assert machine.handle(Start()) == []


def test_an_error_from_the_peer_ends_this_side_without_an_answer() -> None:
    machine = _Echo()
    actions = machine.handle(MessageReceived(wire.Error(3, "bad model")))
    assert actions == [Finish("error: peer says bad model")]
    assert machine.done


def test_a_protocol_error_carries_its_code_and_an_unknown_event_is_a_local_bug() -> None:
    assert ProtocolError("x").code == ErrorCode.PROTOCOL
    assert ProtocolError("x", ErrorCode.LIMIT).code == ErrorCode.LIMIT
    with pytest.raises(TypeError, match="unknown event"):
        _Echo().handle(object())  # type: ignore[arg-type]


def test_error_codes_are_the_numbers_peers_agree_on() -> None:
    """Codes travel in `Error` messages: renumbering one breaks every peer of another build."""
    assert {code.name: int(code) for code in ErrorCode} == {
        "PROTOCOL": 1,
        "VERSION": 2,
        "MISMATCH": 3,
        "UNSUPPORTED": 4,
        "BAD_SETTINGS": 5,
        "BUSY": 6,
        "LIMIT": 7,
        "INTERNAL": 8,
        "SHUTDOWN": 9,
        "UNAUTHORIZED": 10,
    }


# ----------------------------------------------------------------------------- stop pieces


@pytest.mark.parametrize(
    ("token", "is_byte"),
    [
        ("<0x41>", True),
        ("<0xaF>", True),
        ("<0x4142>", False),  # longer than one byte
        ("<0x4>", False),
        ("<0xG1>", False),  # not hex
        ("<0x4G>", False),
        ("<1x41>", False),
        ("<0x41]", False),
        ("<0x41>x", False),
    ],
)
def test_byte_fallback_tokens_are_exactly_the_six_character_hex_forms(
    token: str, is_byte: bool
) -> None:
    assert _is_byte_token(token) is is_byte


# ----------------------------------------------------------------------------- compute tags


@pytest.mark.parametrize(
    ("method", "edge_tags", "cloud_tags"),
    [
        ("ar", set(), {"forward"}),
        ("naive", {"draft"}, {"prefill", "verify"}),
        ("picospec", {"draft", "tree", "keep"}, {"prefill", "verify"}),
    ],
)
def test_each_computation_is_billed_to_its_purpose(
    shared_world: World, method: str, edge_tags: set, cloud_tags: set
) -> None:
    """`compute_by_tag` (a run's stats) splits busy time by the label a machine gives a job."""
    sim, _, _ = shared_world.run(method, max_new_tokens=24, seed=3, gamma=3)
    assert set(sim.compute_by_tag["edge"]) == edge_tags
    assert set(sim.compute_by_tag["cloud"]) == cloud_tags


def test_split_inference_refuses_a_target_without_activations_or_a_penalty(
    shared_world: World,
) -> None:
    info = shared_world.info
    with pytest.raises(ValueError, match=r"^split inference needs a target model that accepts"):
        SplitCloud(info, GenerationSettings())
    with_activations = dataclasses.replace(info, accepts_activations=True)
    SplitCloud(with_activations, GenerationSettings())
    with pytest.raises(ValueError, match=r"^split inference cannot apply a repetition penalty"):
        SplitCloud(with_activations, GenerationSettings(repetition_penalty=1.2))


# ----------------------------------------------------------------------------- HR's O-sample


def _sent(sim) -> list:
    return [rec.info["msg"] for rec in sim.trace if rec.what == "send"]


@pytest.mark.parametrize("piggyback", [True, False])
def test_hr_asks_for_an_o_sample_only_without_the_piggyback(
    hetero_world: World, piggyback: bool
) -> None:
    """X-CoSD's piggybacked O-sample saves a round trip whenever the edge picks region O; without
    it the edge asks (ResampleRequest) and echoes the O token it got, so the run goes on."""
    picked_o = requests = 0
    for seed in range(6):
        sim, edge, cloud = hetero_world.run(
            "xcosd", trace=True, seed=seed, max_new_tokens=10, temperature=1.5,
            hr_piggyback=piggyback,
        )  # fmt: skip
        assert (sim.finish_reason, len(sim.tokens)) == ("length", 10)
        assert cloud.counters.get("stale_drafts", 0) == 0
        picked_o += edge.counters.get("hr_region_O", 0)
        requests += sum(isinstance(m, wire.ResampleRequest) for m in _sent(sim))
        assert edge.counters.get("hr_o_requests", 0) == sum(
            isinstance(m, wire.OToken) for m in _sent(sim)
        )
    assert picked_o > 0
    assert requests == (0 if piggyback else picked_o)


def test_uhlm_counts_the_drafts_it_lets_through_unverified(
    hetero_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """U-HLM's scheme picks the positions to upload and changes nothing of the edge; the edge
    counts the drafts left out."""
    scheme = METHODS["uhlm"].scheme
    pick = scheme.upload_positions

    def watched(self, edge, rnd):
        before = _edge_picture(edge, rnd)
        positions = pick(self, edge, rnd)
        assert _edge_picture(edge, rnd) == before, "upload_positions changed the edge"
        return positions

    monkeypatch.setattr(scheme, "upload_positions", watched)
    sim, edge, _ = hetero_world.run(
        "uhlm", trace=True, seed=5, max_new_tokens=16, gamma=4, uhlm_threshold=0.9
    )
    drafts = [m for m in _sent(sim) if isinstance(m, wire.DraftWithDists)]
    skipped = sum(len(m.tokens) - len(m.dist_positions) for m in drafts)
    assert skipped > 0
    assert edge.counters["uhlm_skipped"] == skipped


def test_the_cloud_names_its_target_model_in_the_handshake(shared_world: World) -> None:
    """The HelloAck's `target` (what a client shows as the cloud's model) is the model's name."""
    info = target_info(shared_world.target, list, (shared_world.alignment,))
    assert info.name == shared_world.target.name != "target"


def test_a_byte_level_decoder_inside_a_sequence_still_matches_bytes() -> None:
    """Some tokenizers wrap ByteLevel in a Sequence decoder; transformers then compares bytes,
    and so must the stop checker (found only through the decoder's JSON)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    from transformers.generation.stopping_criteria import StopStringCriteria

    backend = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.decoder = decoders.Sequence([decoders.Replace("_", " "), decoders.ByteLevel()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert matching_mode(tokenizer) == "byte_level"
    assert StopStringCriteria._get_stop_string_matching_mode(tokenizer) == "byte_level"


def _edge_picture(edge, rnd) -> tuple:
    """What an edge hook could change: the machine's fields and the round's."""
    return (
        edge.state, dict(edge.counters), edge.generated, list(edge.pending_echo),
        list(edge.accepted_per_round), list(edge.draft_ctx), edge.round is rnd, edge._next_job,
        rnd.index, rnd.base, list(rnd.tokens), list(rnd.probs), rnd.rejected_at, rnd.replies,
    )  # fmt: skip


def _cloud_picture(cloud, rej) -> tuple:
    return (
        cloud.state, dict(cloud.counters), list(cloud.output), cloud._next_job, len(cloud.inbox),
        cloud.rejection is rej, rej.index, rej.position, rej.resolved, rej.replies,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("world", "method", "settings"),
    [
        ("shared", "sd", {}),
        ("shared", "acespec", {"tree_budget": 4}),
        ("hetero", "xcosd", {"hr_piggyback": False}),
        ("hetero", "xcosd-e", {"srdv_k": 1, "srdv_m": 2, "temperature": 0.5}),
        ("hetero", "acespec-x", {"srdv_k": 1, "srdv_m": 1}),
        ("hetero", "tr", {}),
        ("hetero", "gr", {}),
    ],
)
def test_a_scheme_returns_its_decision_and_leaves_the_machines_to_apply_it(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, world, method, settings
) -> None:
    """A scheme's hooks draw and decide; committing, sending and counting are the machines' (one
    place each side), so a hook changes no field of its machine or of the round it decides."""
    scheme = METHODS[method].scheme
    decisions: list = []

    def watch_edge(hook):
        def wrapped(self, edge, rnd, msg):
            before = _edge_picture(edge, rnd)
            decision = hook(self, edge, rnd, msg)
            assert _edge_picture(edge, rnd) == before, f"{hook.__name__} changed the edge"
            assert isinstance(decision, Resolved | Ask), decision
            decisions.append(type(decision))
            return decision

        return wrapped

    def watch_cloud(hook):
        def wrapped(self, cloud, rej, *msg):
            before = _cloud_picture(cloud, rej)
            reply = hook(self, cloud, rej, *msg)
            assert _cloud_picture(cloud, rej) == before, f"{hook.__name__} changed the cloud"
            assert isinstance(reply, wire.VerifyResult | wire.Candidates | wire.OToken), reply
            decisions.append(type(reply))
            return reply

        return wrapped

    monkeypatch.setattr(scheme, "edge_on_reject", watch_edge(scheme.edge_on_reject))
    for name in ("cloud_reply", "cloud_on_request"):
        monkeypatch.setattr(scheme, name, watch_cloud(getattr(scheme, name)))
    the_world = request.getfixturevalue(f"{world}_world")
    for seed in range(4):
        sim, _, _ = the_world.run(method, seed=seed, max_new_tokens=16, gamma=3, **settings)
        assert (sim.finish_reason, len(sim.tokens)) == ("length", 16)
    wanted = {wire.VerifyResult} if method == "gr" else {Resolved, wire.VerifyResult}
    if method in ("sd", "xcosd", "xcosd-e", "acespec-x"):
        wanted.add(Ask)  # the draft's p, an O-sample, more candidates, the fallback
    assert wanted <= set(decisions)


# ----------------------------------------------------------------------------- the pipeline cache


@pytest.mark.parametrize("gamma", [1, 3])
def test_picospec_hits_exactly_the_rounds_whose_whole_chain_was_accepted(
    shared_world: World, gamma: int
) -> None:
    """PicoSpec drafts only the continuation after the chain: a fully accepted chain must find it
    (a hit), any rejection must redraft (a miss). The last round ends the run and looks nothing up.
    A kept-path check that compares the wrong prefix turns hits into misses: same tokens, more
    draft work, so only these counters show it."""
    for seed in range(3):
        _, edge, _ = shared_world.run("picospec", seed=seed, max_new_tokens=30, gamma=gamma)
        looked_up = edge.accepted_per_round[:-1]
        assert edge.counters.get("cache_hits", 0) == sum(a == gamma for a in looked_up) > 0
        misses = sum(a < gamma for a in looked_up)
        assert edge.counters.get("cache_misses", 0) == misses
        # one tip, gamma passes, all done before the reply: a miss wastes gamma nodes, a hit none
        assert edge.counters.get("wasted_tree_nodes", 0) == gamma * misses


@pytest.mark.parametrize("seed", [0, 1])
def test_a_hit_wastes_every_tree_node_but_its_kept_path(shared_world: World, seed: int) -> None:
    """A miss wastes its whole tree, a hit all but the γ nodes of the path it keeps; the last
    tree is still unresolved when the run ends (a fixed budget: every tree has B·γ nodes)."""
    gamma, budget = 3, 4
    _, edge, _ = shared_world.run("acespec", seed=seed, max_new_tokens=30, gamma=gamma,
                                  tree_budget=budget, tree_fixed=True)  # fmt: skip
    counts = edge.counters
    hits, misses = counts.get("cache_hits", 0), counts.get("cache_misses", 0)
    assert hits > 0 and misses > 0 and counts["tree_rounds"] == hits + misses + 1
    assert counts["tree_nodes"] == counts["tree_rounds"] * budget * gamma
    assert counts["wasted_tree_nodes"] == (hits + misses) * budget * gamma - hits * gamma


@pytest.mark.parametrize("method", ["picospec", "acespec", "acespec-x"])
def test_every_tree_pass_is_priced_at_the_context_the_session_holds(
    shared_world: World, hetero_world: World, method: str
) -> None:
    """A tree pass hangs from the whole cache, and its cost (attention over that context) is
    priced from the edge's picture of the cache: after a hit keeps a path, the picture must
    hold exactly the kept tokens. Checked against the session itself before every pass."""
    world = hetero_world if method == "acespec-x" else shared_world
    session = world.draft.new_session()
    passes: list[tuple[int, int]] = []

    def edge_executor(job: object) -> object:
        if isinstance(job, TreeForward):
            passes.append((job.context, session.length))
        return run_job(session, job)

    edge, cloud = world.machines(method, seed=2, max_new_tokens=30, gamma=3, temperature=1.0)
    link = Link(bandwidth_bps=1e6, rtt_s=0.02)
    simulate(edge, cloud, link, FLAT_PROFILE, FLAT_PROFILE, edge_executor=edge_executor,
             cloud_executor=session_executor(world.target))  # fmt: skip
    assert edge.counters.get("cache_hits", 0) > 0 and len(passes) > 10
    assert all(priced == held for priced, held in passes)


@pytest.mark.parametrize("method", ["sd", "picospec", "acespec"])
def test_every_drafted_probability_is_the_draft_models_own_at_the_true_context(
    shared_world: World, method: str
) -> None:
    """The KV-cache plan (and the path a pipeline keeps from its tree on a hit) must leave the
    draft model holding exactly the context the edge believes: a cache that holds one token too
    many or too few changes no committed token's law, only the draft, so only the draft's own
    numbers show it. Each token a Draft reports carries the 16-bit count the draft model gives
    it after the prompt, the output before it (the committed tokens the draft echoes included)
    and the round's earlier drafts."""
    gamma = 3
    sim, edge, _ = shared_world.run(method, seed=3, max_new_tokens=30, gamma=gamma, trace=True)
    params = GenerationSettings().sampling
    drafts = [rec.info["msg"] for rec in sim.trace
              if rec.what == "send" and type(rec.info["msg"]) is wire.Draft]  # fmt: skip
    for draft in drafts:
        known = draft.base + len(draft.committed)  # committed: tokens the edge decided
        assert tuple(sim.tokens[draft.base : known]) == draft.committed
        base = [*PROMPT_IDS, *sim.tokens[:known]]
        contexts = [base + list(draft.tokens[:i]) for i in range(len(draft.tokens))]
        rows = shared_world.draft.rows(contexts)
        allowed = shared_world.alignment.draft_in_common
        laws = [draft_row(row, params, allowed=allowed) for row in rows]
        assert list(draft.probs) == [laws[i].count(t) for i, t in enumerate(draft.tokens)]
    assert len(drafts) > 5
    if METHODS[method].family == "pipeline":
        assert edge.counters.get("cache_hits", 0) > 0


def test_acespec_learns_where_the_residual_lies_from_each_full_rejection_reply(
    shared_world: World,
) -> None:
    """AceSpec fits its shape (beta) to the residual mass the draft's alternatives would have
    captured, read off every reply that carries the whole target distribution, and counts the
    branches it drafts."""
    _, edge, _ = shared_world.run("acespec", seed=1, max_new_tokens=30, gamma=3, tree_budget=4)
    assert edge.counters.get("cache_misses", 0) + edge.counters.get("cache_hits", 0) > 0
    assert edge.planner.power_law != DEFAULT_POWER_LAW
    # every tree: the main continuation plus the planned alternatives (the draft has plenty)
    planned = sum(sum(entry["fanout"]) for entry in edge.rounds_log)
    assert edge.counters["tree_branches"] == planned > 0


# ----------------------------------------------------------------------------- building the edge
def _edge(world: World, method: str, target_encode=None, **settings):
    return make_edge(
        method,
        alignment=world.alignment,
        prompt="hello",
        settings=GenerationSettings(**settings),
        draft_encode=lambda _: [1, 2],
        target_decode=lambda ids: " ".join(map(str, ids)),
        target_encode=target_encode,
    )


def test_the_edges_stop_rules_see_the_prompt_in_target_ids(shared_world: World) -> None:
    """transformers matches stop strings across the prompt/output boundary, so the edge's stop
    rules start from the prompt's target ids (encoded only when there are stop strings)."""
    encoded: list[str] = []

    def target_encode(text: str) -> list[int]:
        encoded.append(text)
        return [7, 8, 9]

    assert _edge(shared_world, "ar", target_encode, stop=("x",)).stop_context == [7, 8, 9]
    assert encoded == ["hello"]
    assert _edge(shared_world, "ar", target_encode).stop_context == []
    assert encoded == ["hello"]


def test_edges_that_cannot_run_are_refused_with_the_reason(
    shared_world: World, hetero_world: World
) -> None:
    with pytest.raises(ValueError) as err:
        _edge(hetero_world, "cosd")
    assert str(err.value) == (
        "method 'cosd' needs a shared vocabulary, but the draft and target tokenizers differ; "
        "use 'naive', 'xcosd', 'xcosd-e' or 'xcosd-auto' for a heterogeneous pair "
        "(or the pipelines 'acespec-x', 'deepspec-x' and 'deepspec-tree')"
    )
    with pytest.raises(ValueError) as err:
        _edge(shared_world, "split")
    assert str(err.value) == "split inference needs the target tokenizer on the edge"
    with pytest.raises(ValueError) as err:
        _edge(shared_world, "split", lambda _: [1], repetition_penalty=1.2)
    assert str(err.value) == "split inference cannot apply a repetition penalty (see stream.py)"


def test_build_machines_gives_both_machines_the_pairs_callables(shared_world: World) -> None:
    """The in-process builder (benchmarks, simulator analyses): the edge encodes its stop
    context and decodes its stop checks with the pair's target tokenizer, the cloud serves the
    target model."""
    decoded: list[list[int]] = []

    def target_decode(ids: list[int]) -> str:
        decoded.append(list(ids))
        return " ".join(map(str, ids))

    draft, target = shared_world.draft, shared_world.target
    edge, cloud = build_machines(
        "naive",
        draft_lm=draft,
        target_lm=target,
        alignment=shared_world.alignment,
        draft_encode=lambda _: list(PROMPT_IDS),
        target_encode=lambda _: list(PROMPT_IDS),
        target_decode=target_decode,
        prompt="synthetic",
        settings=GenerationSettings(max_new_tokens=5, stop=("never",)),
    )
    executors = dict(edge_executor=session_executor(draft), cloud_executor=session_executor(target))
    link = Link(bandwidth_bps=1e6, rtt_s=0.02)
    sim = simulate(edge, cloud, link, FLAT_PROFILE, FLAT_PROFILE, **executors)
    assert len(sim.tokens) == 5 and sim.finish_reason == "length"
    assert edge.stop_context == PROMPT_IDS
    assert decoded and decoded[-1] == [*PROMPT_IDS, *sim.tokens]
