"""`wanspec serve` as a real process and `wanspec generate --server` against it (tiny models):
the tokens are the simulator's, and SIGTERM ends an in-flight session with a 'shutdown' error
before the process exits cleanly. (Refusals are tested in-process in test_net_server.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import wanspec
from nethelpers import run
from wanspec import wire
from wanspec.cli import main
from wanspec.net.framing import read_message
from wanspec.protocols.base import PROTOCOL_VERSION, ErrorCode
from wanspec.protocols.registry import edge_fingerprints

TOKEN = "cli-t0ken"


class Served:
    """A `wanspec serve` child process and its merged output, line by line."""

    def __init__(self, args: list[str]) -> None:
        env = {**os.environ, "WANSPEC_THREADS": "1", "WANSPEC_TOKEN": TOKEN}
        command = [sys.executable, "-m", "wanspec.cli", "serve", *args]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout_s: float = 120.0) -> re.Match[str]:
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} in {seen}") from None
            seen.append(line)
            if match := re.search(pattern, line):
                return match


@pytest.fixture
def served(tiny_pair_hetero: tuple[Path, Path]) -> Iterator[tuple[Served, str]]:
    draft, target = tiny_pair_hetero
    server = Served(["--target", str(target), "--draft-tokenizer", str(draft), "--port", "0"])
    try:
        port = server.wait_for(r"serving .* on 127\.0\.0\.1:(\d+)").group(1)
        yield server, f"127.0.0.1:{port}"
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait(timeout=30)
        while not server.lines.empty():  # shown by pytest when the test fails
            print("server:", server.lines.get(), end="")


def _generate(args: list[str], token: str) -> object:
    env = {"WANSPEC_THREADS": "1", "WANSPEC_TOKEN": token}
    return CliRunner().invoke(main, ["generate", *args], env=env)


def test_generate_against_a_served_target_then_sigterm_ends_a_session_in_flight(
    served: tuple[Served, str], tiny_pair_hetero: tuple[Path, Path]
) -> None:
    server, address = served
    draft, target = tiny_pair_hetero
    args = ["--server", address, "--draft", str(draft), "--target", str(target), "--method",
            "xcosd", "--prompt", "hello world", "--max-new-tokens", "6", "--temperature", "0.9",
            "--seed", "4", "--json"]  # fmt: skip
    result = _generate(args, TOKEN)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    pair = wanspec.load_pair(target=target, draft=draft, threads=1)
    sim = wanspec.generate(pair, "hello world", "xcosd", max_new_tokens=6, temperature=0.9, seed=4)
    assert payload["token_ids"] == sim.token_ids and payload["stats"]["clock"] == "wall"

    async def in_flight_then_sigterm() -> wire.Error:
        fp = edge_fingerprints(pair.alignment)
        hello = wire.Hello(PROTOCOL_VERSION, "edge", "xcosd", "", fp.target_tokenizer,
                           fp.draft_tokenizer)  # fmt: skip
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        for msg in (wire.Auth(TOKEN), hello, wire.StartRequest(0, "hi", {"max_new_tokens": 4})):
            writer.write(wire.encode(msg))
        assert isinstance(await read_message(reader), wire.HelloAck)  # the session is open
        server.proc.send_signal(signal.SIGTERM)
        error = await read_message(reader)
        writer.close()
        return error

    error = run(in_flight_then_sigterm(), timeout_s=60)
    assert error.code == ErrorCode.SHUTDOWN and "shutting down" in error.message
    assert server.proc.wait(timeout=30) == 0
    server.wait_for("server stopped", 10)
