"""A request's stop strings and the target's defaults reach the machines, end to end on tiny
models: stop strings as transformers' StopStringCriteria (the target tokenizer and the prompt
reach the edge's StopChecker), and the target's own generation_config when a request names no
sampling setting."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

import wanspec
from wanspec import wire
from wanspec.protocols.base import MessageReceived, Start
from wanspec.protocols.registry import make_edge
from wanspec.protocols.settings import GenerationSettings

PROMPT = "hello world"


@pytest.fixture(scope="module")
def pair(tiny_pair_shared) -> wanspec.api.Pair:
    draft, target = tiny_pair_shared
    return wanspec.load_pair(target=target, draft=draft)


def _hf_greedy(pair, max_new_tokens: int, **kwargs) -> list[int]:
    ids = torch.tensor([pair.target_encode(PROMPT)])
    out = pair.target.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("method", ["ar", "xcosd", "xcosd-e", "acespec"])
def test_a_stop_string_across_the_prompt_boundary_stops_where_transformers_does(
    pair, method: str
) -> None:
    """The stop string begins in the prompt and ends in the first generated token: only a
    checker that sees the prompt (and matches pieces as transformers does) stops there."""
    first = _hf_greedy(pair, 1)[0]
    piece = pair.target.tokenizer.decode([first])
    stop = PROMPT[-3:] + piece[:1]
    assert stop not in pair.decode(_hf_greedy(pair, 12))  # nowhere inside the output alone
    reference = _hf_greedy(pair, 12, stop_strings=[stop], tokenizer=pair.target.tokenizer)
    res = wanspec.generate(pair, PROMPT, method, max_new_tokens=12, temperature=0, stop=[stop])
    assert res.token_ids == reference == [first]
    assert res.stats["finish_reason"] == "stop"
    assert res.stats["tv_bound"] == 0.0  # every method reports it; a one-hot q rounds exactly


def test_the_edge_matches_stop_strings_with_the_target_tokenizer_and_prompt(pair) -> None:
    settings = GenerationSettings(stop=("<|endoftext|>",), temperature=0)
    edge = make_edge(
        "xcosd",
        alignment=pair.alignment,
        prompt=PROMPT,
        settings=settings,
        draft_encode=pair.draft_encode,
        target_decode=pair.decode,
        target_encode=pair.target_encode,
        target_tokenizer=pair.target.tokenizer,
    )
    edge.handle(Start())
    edge.handle(
        MessageReceived(wire.HelloAck(wire.WIRE_VERSION, "", edge.fingerprints.target_tokenizer))
    )
    assert edge.stopper is not None and edge.stopper.pieces is not None
    assert edge.stopper.context == pair.target_encode(PROMPT)
    eos = pair.target.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert edge.stopper.push([5, eos]) == ([5, eos], "stop")  # a special token as stop string


def _tokens(pair, seed: int, **settings) -> list[int]:
    return wanspec.generate(
        pair, PROMPT, "xcosd", max_new_tokens=10, seed=seed, **settings
    ).token_ids


def test_no_sampling_settings_means_the_targets_generation_config(pair) -> None:
    model = pair.target.model
    saved = model.generation_config
    try:
        model.generation_config = GenerationConfig(do_sample=False)
        assert _tokens(pair, 0) == _tokens(pair, 0, temperature=0)
        own = {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3}
        model.generation_config = GenerationConfig(do_sample=True, **own)
        runs = [_tokens(pair, seed) for seed in range(3)]
        assert runs == [_tokens(pair, seed, **own) for seed in range(3)]
        assert runs != [_tokens(pair, seed, temperature=1.0) for seed in range(3)]
    finally:
        model.generation_config = saved
