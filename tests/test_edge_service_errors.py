"""`wanspec edge` when requests go wrong: bad bodies, failures inside, clients that leave.

Every bad request gets OpenAI's error object (never FastAPI's `{"detail": …}`, a plain-text 500,
a broken stream, a source path or a traceback), and an HTTP client that goes away mid-request
gets its cloud session closed at once, so dropped streams cannot fill the cloud's slots.
Real parts: tiny transformers models, a `wanspec serve` cloud behind the WAN proxy, the app
under uvicorn, all on loopback.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wanspec
from nethelpers import refusing_port
from test_edge_service import OPTIONS, http_service
from wanspec.edge_service import EdgeService
from wanspec.net import DirectionSpec
from wanspec.net.background import cloud_behind_wan
from wanspec.net.client import RemotePair
from wanspec.net.server import CloudServer, ServerLimits

METHOD = "naive"
SLOW_WAN = DirectionSpec(rate_bps=10e6, delay_s=0.02)  # a long request stays in flight
LONG = 1000  # tokens (the tiny target holds 1024): 200+ rounds over SLOW_WAN, seconds long
LEAKS = re.compile(r'File "|\.py\b|Traceback|site-packages')


@pytest.fixture(scope="module")
def pair(tiny_pair_hetero: tuple[Path, Path]) -> wanspec.Pair:
    draft, target = tiny_pair_hetero
    return wanspec.load_pair(target=target, draft=draft, threads=1)


@pytest.fixture(scope="module")
def nowhere() -> Iterator[str]:
    """A loopback port where nothing listens: these requests must fail before the cloud."""
    with refusing_port() as port:
        yield f"127.0.0.1:{port}"


def _service(pair: wanspec.Pair, address: str, kind: type[EdgeService] = EdgeService) -> Any:
    edge = RemotePair.of_pair(pair)
    return kind(edge, address, METHOD, OPTIONS, method_settings={"gamma": 4})


@pytest.fixture(scope="module")
def offline(pair: wanspec.Pair, nowhere: str) -> Iterator[tuple[str, str]]:
    """(base URL, model id) of an edge whose cloud is unreachable."""
    service = _service(pair, nowhere)
    with http_service(service) as url:
        yield url, service.model_id


def _send(url: str, body: bytes | None, method: str = "POST") -> tuple[int, str, str]:
    """(status, content type, body text) of one request."""
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["content-type"], err.read().decode()


def _openai_error(status: int, kind: str, text: str) -> dict[str, Any]:
    """The error object in `text`, checked for OpenAI's shape and for leaks of the server."""
    assert kind.startswith("application/json"), (status, kind, text[:200])
    body = json.loads(text)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert not LEAKS.search(text), text[:300]
    return error


BAD_BODIES = {
    "empty prompt": ("/completions", {"prompt": "", "max_tokens": 4}, 400),
    "empty prompt, streamed": ("/completions", {"prompt": "", "stream": True}, 400),
    "not UTF-8": ("/completions", b'{"model": "\xff\xfe", "prompt": "x"}', 400),
    "100k-deep array": ("/completions", b"[" * 100_000 + b"]" * 100_000, 400),
    "100k-deep object": ("/chat/completions", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 400),
    "not JSON": ("/completions", b"{not json", 400),
    "an array": ("/completions", b"[1, 2]", 400),
    "a string": ("/chat/completions", b'"hello"', 400),
    "null": ("/completions", b"null", 400),
    "a number": ("/completions", b"3", 400),
    "no body": ("/completions", b"", 400),
    "no such path": ("/nowhere", b"{}", 404),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_each_bad_body_gets_the_openai_error_shape_with_no_path(
    offline: tuple[str, str], case: str
) -> None:
    base_url, model_id = offline
    path, body, status = BAD_BODIES[case]
    if isinstance(body, dict):
        body = json.dumps({"model": model_id, **body}).encode()
    code, kind, text = _send(base_url + path, body)
    assert code == status, text[:300]
    error = _openai_error(code, kind, text)
    assert error["type"] == "invalid_request_error"
    if case.startswith("empty prompt"):
        assert error["param"] == "prompt" and "empty" in error["message"]


def test_a_wrong_http_method_gets_the_openai_error_shape(offline: tuple[str, str]) -> None:
    code, kind, text = _send(offline[0] + "/completions", None, method="GET")
    assert code == 405
    assert _openai_error(code, kind, text)["type"] == "invalid_request_error"


class _Failing(EdgeService):
    """An edge whose every run fails inside, with a source path in its message."""

    async def run(self, job: Any, on_emit: Callable[[tuple[int, ...]], None]) -> Any:
        raise ValueError("could not open /srv/wanspec/src/wanspec/net/client.py")


def test_a_failure_inside_is_an_openai_shaped_500_and_error_event_naming_no_path(
    pair: wanspec.Pair, nowhere: str
) -> None:
    """A plain-text 500 or a stream cut off mid-chunk tells the client nothing it can parse."""
    service = _service(pair, nowhere, _Failing)
    request = {"model": service.model_id, "prompt": "hello", "max_tokens": 4}
    with http_service(service) as url:
        code, kind, text = _send(url + "/completions", json.dumps(request).encode())
        streamed = _send(url + "/completions", json.dumps({**request, "stream": True}).encode())
    error = _openai_error(code, kind, text)
    assert code == 500 and error == {
        "message": "internal error: ValueError",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    status, _, events = streamed
    assert status == 200 and not LEAKS.search(events)
    data = [line[len("data: ") :] for line in events.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["message"] == "internal error: ValueError"


# ---------------------------------------------------------------------------- clients that leave
def _http_request(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def _wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _drop_mid_request(port: int, body: dict[str, Any], server: CloudServer) -> None:
    """Send `body`, wait until the request is under way (its first event, or the cloud's
    session), then reset the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_http_request(body))
        if body["stream"]:
            got = b""
            while b"data:" not in got:
                chunk = sock.recv(4096)
                assert chunk, "the stream ended before its first event"
                got += chunk
        else:
            assert _wait(lambda: server.active == 1, 10), "no cloud session started"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("stream", [True, False])
def test_dropped_http_requests_close_their_cloud_sessions_and_the_next_request_is_served(
    pair: wanspec.Pair, stream: bool
) -> None:
    """Eight HTTP clients leave mid-request, one after another: each cloud session ends with
    the edge's Close at once (not held for the resume grace, nor run to its end), and a
    request after them is served, not refused as busy."""
    limits = ServerLimits(max_sessions=4, resume_grace_s=30.0)
    with cloud_behind_wan(pair.target, pair.cloud_info, SLOW_WAN, SLOW_WAN, limits=limits) as (
        address,
        server,
        _,
    ):
        service = _service(pair, address)
        body = {"model": service.model_id, "prompt": "hello", "max_tokens": LONG, "stream": stream}
        with http_service(service) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            for dropped in range(1, 9):
                _drop_mid_request(port, body, server)
                ended = _wait(lambda n=dropped: len(server.records) == n, 10)
                held = f"{server.held} held for a reconnection"
                assert ended, f"cloud session {dropped} goes on after its client left ({held})"
            records = list(server.records)
            after = {**body, "max_tokens": 4, "stream": False}
            code, kind, text = _send(url + "/completions", json.dumps(after).encode())
    assert [r.outcome for r in records] == ["closed by edge"] * 8
    assert all(r.rounds < LONG // 20 for r in records)  # cut short, not run to the end
    assert code == 200, text[:300]
    assert kind.startswith("application/json") and json.loads(text)["usage"]["completion_tokens"]
