"""`wanspec edge` from the command line: a real `wanspec serve` process, a real `wanspec edge`
process in front of it, and the `openai` client against the edge (tiny models); plus the
command's clear errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

import wanspec
from nethelpers import refusing_port
from test_net_cli import TOKEN, Served
from wanspec.cli import main


def _listening_port(log: Path, edge: subprocess.Popen[bytes]) -> int:
    """The port `wanspec edge --listen 127.0.0.1:0` got, from uvicorn's start-up line."""
    deadline = time.monotonic() + 120
    while True:
        assert edge.poll() is None, "wanspec edge exited"
        found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return int(found.group(1))
        assert time.monotonic() < deadline, "wanspec edge did not start listening"
        time.sleep(0.2)


@pytest.mark.slow
def test_wanspec_edge_serves_the_openai_api_in_front_of_wanspec_serve(
    tiny_pair_hetero: tuple[Path, Path], tmp_path: Path
) -> None:
    draft, target = tiny_pair_hetero
    server = Served(["--target", str(target), "--draft-tokenizer", str(draft), "--port", "0",
                     "--resume-grace", "5s"])  # fmt: skip
    log = (tmp_path / "edge.log").open("w")
    edge = None
    try:
        address = "127.0.0.1:" + server.wait_for(r"serving .* on 127\.0\.0\.1:(\d+)").group(1)
        command = [sys.executable, "-m", "wanspec.cli", "edge", "--server", address,
                   "--draft", str(draft), "--target", str(target), "--method", "naive",
                   "--listen", "127.0.0.1:0", "--model-name", "tiny"]  # fmt: skip
        env = {**os.environ, "WANSPEC_THREADS": "1", "WANSPEC_TOKEN": TOKEN}
        edge = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        port = _listening_port(tmp_path / "edge.log", edge)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60
        )
        assert [m.id for m in client.models.list()] == ["tiny"]
        got = client.completions.create(
            model="tiny", prompt="hello world", max_tokens=6, temperature=0
        )
    finally:
        if edge is not None:
            edge.terminate()
            edge.wait(timeout=30)
        server.proc.kill()
        server.proc.wait(timeout=30)
        log.close()
        print((tmp_path / "edge.log").read_text())  # shown by pytest when the test fails
    pair = wanspec.load_pair(target=target, draft=draft, threads=1)
    expected = wanspec.generate(pair, "hello world", "naive", max_new_tokens=6, temperature=0)
    assert got.choices[0].text == expected.text
    assert got.model_extra["wanspec"]["new_tokens"] == 6


def test_wanspec_edge_refuses_an_unknown_method_and_an_unreachable_cloud(
    tiny_pair_hetero: tuple[Path, Path],
) -> None:
    draft, target = tiny_pair_hetero
    models = ["--draft", str(draft), "--target", str(target)]
    env = {"WANSPEC_THREADS": "1"}
    runner = CliRunner()
    result = runner.invoke(
        main, ["edge", "--server", "127.0.0.1:9", *models, "--method", "nope"], env=env
    )
    assert result.exit_code != 0 and "nope" in result.output
    with refusing_port() as port:
        result = runner.invoke(
            main,
            ["edge", "--server", f"127.0.0.1:{port}", *models, "--connect-timeout", "2"],
            env=env,
        )
    assert result.exit_code == 1 and "cannot reach" in result.output
    result = runner.invoke(main, ["edge", "--server", "x:1", "--listen", "nowhere", *models])
    assert result.exit_code == 1 and "HOST:PORT" in result.output
