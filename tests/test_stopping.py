"""Stop strings end a run exactly where transformers' StopStringCriteria ends `generate`."""

from __future__ import annotations

import json
import random

import pytest
import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast, StopStringCriteria

from wanspec import wire
from wanspec.models.tiny import build_tokenizer
from wanspec.protocols.base import Emit, Finish, Send
from wanspec.protocols.stopping import StopChecker, emit_tokens, matching_mode


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny sentencepiece-style tokenizer with Llama's byte fallback: `<0xNN>` tokens and a
    Replace/ByteFallback/Fuse/Strip decoder."""
    base = build_tokenizer("metaspace", 160)
    spec = json.loads(base.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


TOKENIZERS = {
    "bytelevel": lambda: build_tokenizer("bytelevel", 320),
    "metaspace": lambda: build_tokenizer("metaspace", 160),
    "byte_fallback": byte_fallback_tokenizer,
}
EXPECTED_MODE = {"bytelevel": "byte_level", "metaspace": None, "byte_fallback": "byte_fallback"}
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox — naïve café 😀 jumps.",
    "Answer: 12 plus 30 is 42.",
    "sea shells by the sea shore",
]


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    tok = TOKENIZERS[request.param]()
    tok.style = request.param
    return tok


def transformers_stop_index(tok, stops: list[str], prompt: list[int], output: list[int]):
    """1 + the index of the first output token after which generate's criterion fires."""
    criterion = StopStringCriteria(tok, stops)
    for k in range(1, len(output) + 1):
        if bool(criterion(torch.tensor([prompt + output[:k]]), None)[0]):
            return k
    return None


def wanspec_stop_index(tok, stops: list[str], prompt: list[int], output: list[int]):
    checker = StopChecker(max_new_tokens=10_000, stop=stops, tokenizer=tok, context=prompt)
    kept, reason = checker.push(output)
    return len(kept) if reason == "stop" else None


def random_sequence(tok, rng: random.Random) -> list[int]:
    """Real text (so words and multi-byte characters occur), random ids and special tokens."""
    ids = tok(rng.choice(TEXTS), add_special_tokens=False)["input_ids"]
    start = rng.randrange(len(ids))
    ids = ids[start : start + rng.randint(3, 20)]
    for _ in range(rng.randint(0, 4)):
        ids.insert(rng.randrange(len(ids) + 1), rng.randrange(len(tok)))
    return ids


def random_stops(tok, rng: random.Random, sequence: list[int], cut: int) -> list[str]:
    """Substrings of the sequence's text, one across the prompt/output cut, special tokens."""
    text = tok.decode(sequence, skip_special_tokens=False)
    stops = []
    for _ in range(rng.randint(1, 3)):
        a = rng.randrange(len(text))
        stops.append(text[a : a + rng.randint(1, 7)])
    around = tok.decode(sequence[max(0, cut - 2) : cut + 2], skip_special_tokens=False)
    if len(around) > 2:
        mid = len(around) // 2
        stops.append(around[mid - rng.randint(1, mid) : mid + rng.randint(1, 3)])
    if rng.random() < 0.3:
        stops.append(rng.choice(tok.all_special_tokens))
    return [s for s in dict.fromkeys(stops) if s and "\ufffd" not in s]


def test_matching_mode_is_transformers(tokenizer) -> None:
    assert matching_mode(tokenizer) == EXPECTED_MODE[tokenizer.style]
    assert matching_mode(tokenizer) == StopStringCriteria._get_stop_string_matching_mode(tokenizer)


def agree_on_random_cases(tokenizer, rng: random.Random, cases: int) -> tuple[int, int]:
    """Our stop position equals the criterion's on random cases; how many fired, and how many
    of those matched across the prompt/output boundary."""
    fired = crossing = 0
    for _ in range(cases):
        sequence = random_sequence(tokenizer, rng)
        cut = rng.randint(0, len(sequence) - 1)
        prompt, output = sequence[:cut], sequence[cut:]
        stops = random_stops(tokenizer, rng, sequence, cut)
        if not stops:
            continue
        try:
            theirs = transformers_stop_index(tokenizer, stops, prompt, output)
        except ValueError:  # transformers refuses strings no token can end; we just never stop
            assert wanspec_stop_index(tokenizer, stops, prompt, output) is None
            continue
        ours = wanspec_stop_index(tokenizer, stops, prompt, output)
        assert ours == theirs, (stops, prompt, output)
        fired += theirs is not None
        crossing += theirs is not None and prompt != [] and ours < len(output)
    return fired, crossing


def test_stop_position_equals_stop_string_criteria(tokenizer) -> None:
    fired, crossing = agree_on_random_cases(tokenizer, random.Random(len(tokenizer)), 250)
    assert fired > 60  # the cases really exercise matches, not only misses
    assert crossing > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_tokenizers_stop_where_the_criterion_does(name: str) -> None:
    from transformers import AutoTokenizer

    from wanspec.models.registry import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name, progress=False))
    fired, _ = agree_on_random_cases(tokenizer, random.Random(1), 12)
    assert fired >= 6


def test_special_token_stop_string_fires_on_the_special_token() -> None:
    tok = build_tokenizer("bytelevel", 320)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    output = [*tok("hello there", add_special_tokens=False)["input_ids"], eot, 5, 6]
    assert wanspec_stop_index(tok, ["<|endoftext|>"], [], output) == len(output) - 2
    assert transformers_stop_index(tok, ["<|endoftext|>"], [], output) == len(output) - 2


def test_match_across_the_prompt_boundary_keeps_the_completing_token() -> None:
    tok = build_tokenizer("bytelevel", 320)
    prompt = tok("The quick bro", add_special_tokens=False)["input_ids"]
    output = tok("wn fox jumps", add_special_tokens=False)["input_ids"]
    stopper = StopChecker(max_new_tokens=50, stop=["brown"], tokenizer=tok, context=prompt)
    actions, done = emit_tokens(stopper, output)
    k = transformers_stop_index(tok, ["brown"], prompt, output)
    assert k is not None and tok.decode(output[:k]).startswith("wn")
    assert done and stopper.output == output[:k]
    assert actions == [Emit(tuple(output[:k])), Send(wire.Close("done")), Finish("stop")]
    # without the prompt as context the match is not there to find
    alone = StopChecker(max_new_tokens=50, stop=["brown"], tokenizer=tok)
    assert alone.push(output) == (output, None)


def test_a_stop_string_inside_the_prompt_alone_does_not_fire() -> None:
    tok = build_tokenizer("bytelevel", 320)
    prompt = tok("stop here", add_special_tokens=False)["input_ids"]
    stopper = StopChecker(max_new_tokens=3, stop=["stop"], tokenizer=tok, context=prompt)
    assert stopper.push([5, 6, 7]) == ([5, 6, 7], "length")


def test_unknown_ids_break_a_match() -> None:
    tok = build_tokenizer("bytelevel", 320)
    ab = tok("ab", add_special_tokens=False)["input_ids"]
    assert len(ab) >= 1
    stopper = StopChecker(max_new_tokens=9, stop=["ab"], tokenizer=tok)
    unknown = len(tok) + 5  # a padding row of the logits: no vocabulary string
    assert stopper.push([unknown, *ab])[1] == "stop"
    split = tok.convert_tokens_to_ids(["a", "b"])
    broken = StopChecker(max_new_tokens=9, stop=["ab"], tokenizer=tok)
    assert broken.push([split[0], unknown, split[1]])[1] is None


def test_decoder_only_checker_still_matches_decoded_text() -> None:
    def decode(ids: list[int]) -> str:
        return " ".join(map(str, ids))

    stopper = StopChecker(max_new_tokens=9, stop=["3 4"], decode=decode, context=[1, 3])
    assert stopper.push([4, 5]) == ([4], "stop")
    with pytest.raises(ValueError, match="tokenizer"):
        StopChecker(max_new_tokens=3, stop=["x"])
