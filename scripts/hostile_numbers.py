"""What hostile clients cost a `wanspec serve` process: memory, a good client's time, metrics.

On the tiny heterogeneous pair (`make_tiny_pair(folder, shared=False, seed=3)`: a Llama target
with a 1024-token context, float32, 512 KV-cache bytes per token), served in-process over
loopback with the default limits:

(a) peak RSS against prompt length: for each length a fresh subprocess loads the target, starts
    the server, warms it up with a short request, resets the process's peak (`clear_refs` 5),
    and sends one `ar` request of exactly that many target tokens (max_new_tokens 16, EOS
    ignored) from a raw-frames client (no model on the client side, so the memory is the
    server's). It prints the session's KV-cache estimate, VmRSS before, VmHWM and VmRSS after,
    the deltas, the model passes the request cost and what the server answered; a prompt past
    the context must be refused at once (LIMIT, no pass).
(b) a good client's 16-token `xcosd-e` generation (greedy, EOS ignored) alone, and while another
    client sends maximal `ar` prompts (context - 16 tokens, 16 new) back to back for the whole of
    it, on a server with `prefill_chunk` 256 and with 0 (no chunking): median total seconds and
    median longest wait between two emits, over `--rounds` runs.
(c) the size of /metrics before and after 1,000 Hellos naming 4 KiB random methods (each
    refused, UNSUPPORTED).

    .venv/bin/python scripts/hostile_numbers.py [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LENGTHS = (250, 500, 1000, 4000, 24000)
MAX_NEW = 16
GOOD_PROMPT = "hello world, the quick brown fox"
REFUSED_HELLOS, METHOD_CHARS = 1000, 4096


# ---------------------------------------------------------------------------- shared helpers
def proc_status(field: str) -> int:
    """A /proc/self/status size in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> bool:
    """Make VmHWM the current RSS (Linux >= 4.0); False when the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def mib(count: float) -> str:
    return f"{count / (1 << 20):.2f} MiB"


def prompt_of(encode: Callable[[str], list[int]], tokens: int) -> tuple[str, int]:
    """A text that `encode` makes `tokens` ids (or the nearest above): the shortest prefix of a
    long random word salad that reaches the count, found by bisection."""
    import random

    rng = random.Random(tokens)
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "edge", "token",
             "draft", "target", "seven", "forty", "quick", "brown", "fox"]  # fmt: skip
    text = ""
    while len(encode(text)) < tokens:
        text += " ".join(rng.choice(words) for _ in range(max(tokens, 64))) + " "
    low, high = 1, len(text)
    while low < high:
        middle = (low + high) // 2
        if len(encode(text[:middle])) >= tokens:
            high = middle
        else:
            low = middle + 1
    return text[:low], len(encode(text[:low]))


@contextmanager
def serving(target_lm: Any, info: Any, **options: Any) -> Iterator[Any]:
    """A `CloudServer` on loopback, on a loop thread of its own."""
    from wanspec.net.background import BackgroundLoop
    from wanspec.net.server import CloudServer

    with BackgroundLoop("wanspec-cloud") as loop:
        server = CloudServer(target_lm, info, port=0, **options)
        loop.run(server.start())
        try:
            yield server
        finally:
            loop.run(server.stop(), 30)


def ar_hello(info: Any) -> Any:
    from wanspec import wire
    from wanspec.protocols.base import PROTOCOL_VERSION

    fp = info.tokenizer_fingerprint
    return wire.Hello(PROTOCOL_VERSION, "edge", "ar", info.model_fingerprint, fp, fp)


async def raw_ar(address: tuple[str, int], info: Any, prompt: str) -> tuple[str, int]:
    """One `ar` request from raw frames: (what the server answered, tokens received)."""
    from wanspec import wire
    from wanspec.net.framing import ConnectionClosed, read_message
    from wanspec.protocols.base import ErrorCode
    from wanspec.protocols.settings import GenerationSettings

    settings = GenerationSettings(max_new_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    reader, writer = await asyncio.open_connection(*address)
    limits = wire.DEFAULT_LIMITS.with_vocab(info.vocab.target_width)
    start = wire.StartRequest(0, prompt, settings.to_dict())
    writer.write(wire.encode(ar_hello(info), limits) + wire.encode(start, limits))
    received, outcome = 0, "closed"
    try:
        while True:
            msg = await read_message(reader, limits)
            if isinstance(msg, wire.Error):
                outcome = f"refused {ErrorCode(msg.code).name}: {msg.message}"
                break
            if isinstance(msg, wire.Tokens):
                received += len(msg.ids)
                if msg.finished:
                    outcome = "done"
                    writer.write(wire.encode(wire.Close("done"), limits))
                    break
    except ConnectionClosed:
        pass
    writer.close()
    return outcome, received


def passes(server: Any) -> int:
    return int(server.metrics.value("wanspec:batch_size_count"))


# ---------------------------------------------------------------------------- (a), one child
def one_length(models: Path, tokens: int, threads: int) -> dict[str, Any]:
    """Measure one prompt length in this (fresh) process; the parent prints it."""
    from wanspec.models.lm import load_model
    from wanspec.models.registry import load_tokenizer
    from wanspec.net.server import build_target_info

    target_lm = load_model(models / "hetero-target", threads=threads)
    info = build_target_info(target_lm, [load_tokenizer(models / "hetero-draft")])
    prompt, actual = prompt_of(info.encode, tokens)
    with serving(target_lm, info) as server:
        warm = asyncio.run(raw_ar(server.address, info, "warm up the server"))
        assert warm[0] == "done", warm
        gc.collect()
        rss0 = proc_status("VmRSS")
        reset = reset_peak()
        hwm0, passes0 = proc_status("VmHWM"), passes(server)
        began = time.perf_counter()
        outcome, received = asyncio.run(raw_ar(server.address, info, prompt))
        seconds = time.perf_counter() - began
        hwm1, rss1 = proc_status("VmHWM"), proc_status("VmRSS")
        used = passes(server) - passes0
    return {
        "tokens": actual,
        "rss_before": rss0,
        "hwm_before": hwm0,
        "peak_reset": reset,
        "hwm_after": hwm1,
        "rss_after": rss1,
        "seconds": seconds,
        "passes": used,
        "received": received,
        "outcome": outcome,
        "context": info.context_length,
    }


def part_a(models: Path, threads: int, per_token: int) -> None:
    print(f"(a) peak RSS against prompt length (ar, max_new_tokens {MAX_NEW}, one process each;"
          " sizes in MiB)")  # fmt: skip
    header = ("tokens", "KV estimate", "RSS before", "peak after", "peak-before",
              "RSS after-before", "passes", "seconds", "answer")  # fmt: skip
    print("    " + " | ".join(header))
    for tokens in LENGTHS:
        child = [sys.executable, __file__, "--one-length", str(tokens), "--models", str(models),
                 "--threads", str(threads)]  # fmt: skip
        done = subprocess.run(child, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"    {tokens}: the child failed:\n{done.stderr[-2000:]}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        answer = row["outcome"] if row["outcome"] != "done" else f"done, {row['received']} tokens"
        kv = mib((row["tokens"] + MAX_NEW) * per_token)
        cells = (str(row["tokens"]), kv, mib(row["rss_before"]), mib(row["hwm_after"]),
                 mib(row["hwm_after"] - row["rss_before"]),
                 mib(row["rss_after"] - row["rss_before"]), str(row["passes"]),
                 f"{row['seconds']:.3f}", answer[:160])  # fmt: skip
        print("    " + " | ".join(cells))
        if not row["peak_reset"]:
            print("      (the kernel refused to reset VmHWM: the peak includes loading)")


# ---------------------------------------------------------------------------- (b)
async def good_run(pair: Any, address: tuple[str, int]) -> tuple[float, float, int]:
    """The good client's generation: (total seconds, longest wait between emits, tokens)."""
    from wanspec.net.client import RemotePair, generate_async
    from wanspec.protocols.settings import GenerationSettings

    settings = GenerationSettings(max_new_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    loop = asyncio.get_running_loop()
    began = loop.time()
    marks = [began]
    result = await generate_async(
        RemotePair.of_pair(pair),
        GOOD_PROMPT,
        "xcosd-e",
        settings,
        address,
        on_emit=lambda _: marks.append(loop.time()),
    )
    ended = loop.time()
    gaps = [b - a for a, b in zip(marks, [*marks[1:], ended], strict=True)]
    return ended - began, max(gaps), len(result.tokens)


async def good_beside_hostile(
    pair: Any, address: tuple[str, int], prompt: str
) -> tuple[float, float, int, int]:
    """The good run while a hostile client sends maximal prompts back to back."""
    stop, hostile = asyncio.Event(), [0]

    async def flood() -> None:
        while not stop.is_set():
            outcome, _ = await raw_ar(address, pair.cloud_info, prompt)
            assert outcome == "done", outcome
            hostile[0] += 1

    flooding = asyncio.create_task(flood())
    await asyncio.sleep(0.02)  # its first prefill is under way
    try:
        seconds, gap, tokens = await good_run(pair, address)
    finally:
        stop.set()
        await flooding
    return seconds, gap, tokens, hostile[0]


def part_b(pair: Any, rounds: int) -> None:
    info = pair.cloud_info
    prompt, tokens = prompt_of(info.encode, info.context_length - MAX_NEW)
    print(f"(b) good client: xcosd-e, {MAX_NEW} tokens; hostile client: ar prompts of {tokens} "
          f"tokens (context {info.context_length} - {MAX_NEW}), back to back; medians of "
          f"{rounds} runs")  # fmt: skip
    for chunk in (256, 0):
        with serving(pair.target, info, prefill_chunk=chunk) as server:
            asyncio.run(good_run(pair, server.address))  # warm up
            began = time.perf_counter()
            outcome, _ = asyncio.run(raw_ar(server.address, info, prompt))
            hostile_alone = time.perf_counter() - began
            assert outcome == "done", outcome
            alone, beside, floods = [], [], []
            for _ in range(rounds):
                alone.append(asyncio.run(good_run(pair, server.address)))
                seconds, gap, got, hostile = asyncio.run(
                    good_beside_hostile(pair, server.address, prompt)
                )
                beside.append((seconds, gap, got))
                floods.append(hostile)
        assert all(run[2] == MAX_NEW for run in [*alone, *beside])
        label = f"prefill_chunk {chunk}" if chunk else "prefill_chunk 0 (no chunking)"
        print(f"    {label}: one hostile request alone {hostile_alone:.3f} s")
        for name, runs in (("alone", alone), ("beside the hostile client", beside)):
            total = statistics.median(r[0] for r in runs)
            gap = statistics.median(r[1] for r in runs)
            worst = max(r[1] for r in runs)
            print(f"      good client {name}: {total:.3f} s total, longest wait between emits "
                  f"{gap:.3f} s (worst of {rounds}: {worst:.3f} s)")  # fmt: skip
        print(f"      hostile requests completed during the good runs: {floods}")


# ---------------------------------------------------------------------------- (c)
async def refused_hellos(pair: Any, address: tuple[str, int]) -> dict[int, int]:
    from wanspec import wire
    from wanspec.net.framing import ConnectionClosed, read_message
    from wanspec.protocols.base import PROTOCOL_VERSION
    from wanspec.protocols.registry import edge_fingerprints

    fp = edge_fingerprints(pair.alignment, pair.target.fingerprint)
    codes: dict[int, int] = {}
    for _ in range(REFUSED_HELLOS):
        reader, writer = await asyncio.open_connection(*address)
        method = secrets.token_hex(METHOD_CHARS // 2)
        hello = wire.Hello(PROTOCOL_VERSION, "edge", method, fp.target_model,
                           fp.target_tokenizer, fp.draft_tokenizer)  # fmt: skip
        writer.write(wire.encode(hello))
        try:
            reply = await asyncio.wait_for(read_message(reader), 10)
            code = reply.code if isinstance(reply, wire.Error) else -1
        except ConnectionClosed:
            code = 0
        codes[code] = codes.get(code, 0) + 1
        writer.close()
    return codes


def scrape(server: Any) -> str:
    port = server.metrics.serve_http(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            return page.read().decode()
    finally:
        server.metrics.stop_http()


def part_c(pair: Any) -> None:
    from wanspec.protocols.base import ErrorCode

    print(f"(c) /metrics after {REFUSED_HELLOS} Hellos naming {METHOD_CHARS}-character random "
          "methods")  # fmt: skip
    with serving(pair.target, pair.cloud_info) as server:
        before = scrape(server)
        began = time.perf_counter()
        codes = asyncio.run(refused_hellos(pair, server.address))
        seconds = time.perf_counter() - began
        deadline = time.monotonic() + 30
        while len(server.records) < REFUSED_HELLOS and time.monotonic() < deadline:
            time.sleep(0.01)
        after = scrape(server)
    named = {ErrorCode(c).name if c > 0 else str(c): n for c, n in codes.items()}
    print(f"    replies: {named} in {seconds:.2f} s")
    print(f"    /metrics: {len(before.encode())} bytes before, {len(after.encode())} bytes after")


# ---------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per timing in (b)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--parts", default="abc", help="which of (a), (b), (c) to run")
    parser.add_argument("--one-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--models", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    import transformers

    transformers.logging.set_verbosity_error()  # the long prompts' length warning
    if args.one_length is not None:
        print(json.dumps(one_length(args.models, args.one_length, args.threads)))
        return

    import wanspec
    from wanspec.models.tiny import make_tiny_pair

    with tempfile.TemporaryDirectory() as folder:
        draft, target = make_tiny_pair(folder, shared=False, seed=3)
        pair = wanspec.load_pair(target=target, draft=draft, threads=args.threads)
        info = pair.cloud_info
        print(f"tiny hetero pair: context {info.context_length} tokens, "
              f"{info.kv_bytes_per_token} KV-cache bytes per token")  # fmt: skip
        if "a" in args.parts:
            part_a(Path(folder), args.threads, info.kv_bytes_per_token)
        if "b" in args.parts:
            part_b(pair, args.rounds)
        if "c" in args.parts:
            part_c(pair)


if __name__ == "__main__":
    main()
