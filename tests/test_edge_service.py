"""`wanspec edge` as an OpenAI-compatible service, driven by the official `openai` client.

Real parts throughout: tiny transformers models, a `wanspec serve` cloud behind the WAN proxy on
loopback, the FastAPI app under uvicorn on a loopback port, and the `openai` package as the
application. Completions must equal `wanspec.generate(..., server=...)` for the same settings,
streams must carry that very text as tokens are committed, chat must condition the target on
exactly transformers' `apply_chat_template` ids, bad requests get OpenAI's 4xx error shape, and
a link cut mid-stream is resumed without a visible seam.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
import uvicorn

import wanspec
from cuttable import CuttableLink, cuttable_link
from nethelpers import refusing_port
from wanspec.edge_service import EdgeService, TextStream, chat_continuation, create_app
from wanspec.models.registry import prompt_encoder
from wanspec.net import DirectionSpec
from wanspec.net.background import cloud_behind_wan
from wanspec.net.client import ClientOptions, RemotePair
from wanspec.net.resume import RetryPolicy

PROMPT = "hello world"
NEW = 12
METHOD = "naive"
WAN = DirectionSpec(rate_bps=10e6, delay_s=0.01)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hello there"},
]
OPTIONS = ClientOptions(timeout_s=60.0, retry=RetryPolicy(attempts=12, first_delay_s=0.05))


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    loaded = wanspec.load_pair(target=target, draft=draft, threads=1)
    loaded.target.tokenizer.chat_template = TEMPLATE  # the tiny tokenizers come without one
    return loaded


@pytest.fixture(scope="module")
def cloud(pair: wanspec.Pair) -> Iterator[str]:
    with cloud_behind_wan(pair.target, pair.cloud_info, WAN, WAN, seed=4) as (address, _, _):
        yield address


@contextmanager
def http_service(service: EdgeService) -> Iterator[str]:
    """The app under uvicorn on a free loopback port, in a thread; yields its /v1 base URL."""
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(20)


def _service(pair: wanspec.Pair, address: str) -> EdgeService:
    edge = RemotePair.of_pair(pair)
    return EdgeService(edge, address, METHOD, OPTIONS, method_settings={"gamma": 4})


@pytest.fixture(scope="module")
def base_url(pair: wanspec.Pair, cloud: str) -> Iterator[str]:
    with http_service(_service(pair, cloud)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model_id(pair: wanspec.Pair) -> str:
    return RemotePair.of_pair(pair).target_name


def _reference(pair: wanspec.Pair, cloud: str, prompt: str, **settings: Any) -> Any:
    return wanspec.generate(pair, prompt, METHOD, server=cloud, max_new_tokens=NEW, **settings)


# ----------------------------------------------------------------------------- completions
def test_the_service_lists_the_one_model_it_serves(client: openai.OpenAI, model_id: str) -> None:
    assert [m.id for m in client.models.list()] == [model_id]
    assert client.models.retrieve(model_id).id == model_id


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_completion_is_what_wanspec_generate_gives_for_the_same_settings(
    pair: wanspec.Pair, cloud: str, client: openai.OpenAI, model_id: str, temperature: float
) -> None:
    expected = _reference(pair, cloud, PROMPT, temperature=temperature, seed=5)
    got = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=NEW, temperature=temperature, seed=5
    )
    assert got.choices[0].text == expected.text
    assert got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == len(expected.token_ids) == NEW
    assert got.usage.prompt_tokens == len(pair.target_encode(PROMPT))
    stats = got.model_extra["wanspec"]
    assert stats["rounds"] == expected.stats["rounds"] and stats["reconnects"] == 0
    # the same protocol frames both ways: the session's own Resume/Resumed are not counted
    assert stats["uplink_bits"] == expected.stats["uplink_bits"]
    assert stats["downlink_bits"] == expected.stats["downlink_bits"]
    assert 0 <= stats["acceptance_rate"] <= 1


def test_a_stream_carries_the_same_text_chunk_by_chunk_as_tokens_are_committed(
    pair: wanspec.Pair, cloud: str, client: openai.OpenAI, model_id: str
) -> None:
    expected = _reference(pair, cloud, PROMPT, temperature=0.0)
    arrivals: list[tuple[float, Any]] = []
    began = time.monotonic()
    stream = client.completions.create(
        model=model_id,
        prompt=PROMPT,
        max_tokens=NEW,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        arrivals.append((time.monotonic() - began, chunk))
    texts = [(t, c.choices[0].text) for t, c in arrivals if c.choices and c.choices[0].text]
    assert "".join(text for _, text in texts) == expected.text
    # several chunks, the first out long before the request is over (not held back to the end)
    assert len(texts) >= 3
    assert texts[0][0] < 0.6 * arrivals[-1][0]
    finals = [c for _, c in arrivals if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert finals[0].model_extra["wanspec"]["rounds"] > 0
    assert arrivals[-1][1].usage.completion_tokens == NEW


# ----------------------------------------------------------------------------- chat
@pytest.mark.parametrize("adds_bos", [False, True])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_a_chat_travels_as_exactly_the_templates_ids(
    tiny_models: dict[str, Path], family: str, adds_bos: bool
) -> None:
    from tokenizers import processors
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models[family])
    tokenizer.chat_template = TEMPLATE
    if adds_bos:  # as Llama's and Gemma's real tokenizers do
        bos = tokenizer.bos_token
        special = [(bos, tokenizer.bos_token_id)]
        post = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=special)
        tokenizer.backend_tokenizer.post_processor = post
    expected = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    encode = prompt_encoder(tokenizer)
    ids = [*encode(""), *chat_continuation(encode, tokenizer, CHAT)]
    assert ids == list(expected["input_ids"])
    assert ids.count(tokenizer.bos_token_id) == 1  # once, whether the encoder adds one or not


def test_chat_completions_condition_the_target_on_the_chat_template(
    pair: wanspec.Pair, client: openai.OpenAI, model_id: str
) -> None:
    template_ids = pair.target.tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True
    )["input_ids"]
    ids = torch.tensor([template_ids])
    greedy = pair.target.model.generate(
        ids, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(ids)
    )[0, len(template_ids) :]
    expected = pair.decode(greedy.tolist())
    got = client.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=NEW, temperature=0
    )
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == expected
    assert got.usage.prompt_tokens == len(template_ids)
    streamed = client.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=NEW, temperature=0, stream=True
    )
    chunks = list(streamed)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected


# ----------------------------------------------------------------------------- bad requests
def _post(base_url: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        base_url + path, body, {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/completions", {"prompt": "x"}, 400, "model"),
        ("/completions", {"model": "MODEL"}, 400, "prompt"),
        ("/completions", {"model": "MODEL", "prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
        ("/completions", {"model": "MODEL", "prompt": "x", "n": 2}, 400, "n"),
        ("/completions", {"model": "MODEL", "prompt": "x", "temperature": 9}, 400, "temperature"),
        ("/completions", {"model": "MODEL", "prompt": ["a", "b"]}, 400, "prompt"),
        ("/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/chat/completions", {"model": "MODEL", "messages": []}, 400, "messages"),
        ("/chat/completions", {"model": "MODEL", "messages": [{"role": "x"}]}, 400, None),
        ("/chat/completions", {"model": "nope", "messages": CHAT}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_shaped_4xx_errors(
    base_url: str, model_id: str, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    if body.get("model") == "MODEL":
        body = {**body, "model": model_id}
    code, answer = _post(base_url, path, json.dumps(body).encode())
    assert code == status
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param)
    if status == 404:
        assert error["code"] == "model_not_found"


def test_malformed_json_and_the_openai_clients_own_errors(
    base_url: str, client: openai.OpenAI, model_id: str
) -> None:
    code, answer = _post(base_url, "/completions", b"{not json")
    assert code == 400 and answer["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt="x", max_tokens=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")


def test_an_unreachable_cloud_is_a_503_and_an_error_event_in_a_stream(
    pair: wanspec.Pair, model_id: str
) -> None:
    with refusing_port() as port, http_service(_service(pair, f"127.0.0.1:{port}")) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model=model_id, prompt=PROMPT, max_tokens=4)
        assert refused.value.status_code == 503
        assert refused.value.body["type"] == "server_error"
        with pytest.raises(openai.APIError, match="cannot reach"):
            list(client.completions.create(model=model_id, prompt=PROMPT, stream=True))


# ----------------------------------------------------------------------------- text pieces
def test_streamed_text_holds_back_a_possible_stop_and_ends_before_it() -> None:
    pieces = {1: "ab", 2: "c", 3: "X", 4: "Y", 5: "Z", 6: "de"}
    text = TextStream(lambda ids: "".join(pieces[i] for i in ids), stop=["XYZ"])
    assert text.push([1]) == "ab"
    assert text.push([2, 3]) == "c"  # "X" may begin the stop sequence: held back
    assert text.push([4]) == ""
    assert text.push([5, 6]) == ""  # the stop sequence is complete: nothing of it goes out
    assert text.finish() == "" and text.text == "abc" and text.stopped
    other = TextStream(lambda ids: "".join(pieces[i] for i in ids), stop=["XYZ"])
    assert other.push([3, 4]) + other.push([6]) + other.finish() == "XYde"  # no stop: all of it


def test_a_stop_sequence_ends_the_completion_text_before_it(
    pair: wanspec.Pair, cloud: str, client: openai.OpenAI, model_id: str
) -> None:
    full = _reference(pair, cloud, PROMPT, temperature=0.0).text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), "the greedy text should have a visible middle"
    got = client.completions.create(
        model=model_id, prompt=PROMPT, max_tokens=NEW, temperature=0, stop=[stop]
    )
    assert got.choices[0].text == full[: full.index(stop)]
    assert got.choices[0].finish_reason == "stop"


# ----------------------------------------------------------------------------- resume
def test_a_link_cut_mid_stream_is_resumed_without_a_seam(pair: wanspec.Pair) -> None:
    with cuttable_link(pair, grace_s=20.0) as link:
        expected = _reference(pair, link.address, PROMPT, temperature=0.0)
        with http_service(_service(pair, link.address)) as url:
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
            model = RemotePair.of_pair(pair).target_name
            chunks = _stream_cutting_once(client, model, link)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert link.drops, "the link was never cut"
    assert text == expected.text
    stats = [c.model_extra["wanspec"] for c in chunks if "wanspec" in (c.model_extra or {})]
    assert stats and stats[0]["reconnects"] >= 1 and stats[0]["restarts"] == 0


def _stream_cutting_once(client: openai.OpenAI, model: str, link: CuttableLink) -> list[Any]:
    """Stream a greedy completion, cutting the link after the second chunk for half a second."""
    chunks: list[Any] = []
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=NEW, temperature=0, stream=True
    )
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 2:
            link.cut()
            link.drops.append(len(chunks))
            threading.Thread(target=asyncio.run, args=(link.restore_after(0.5),)).start()
    return chunks
