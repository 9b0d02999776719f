"""Many edges against one server over real loopback TCP: throughput batched vs one at a time.

`python -m wanspec.net.loadtest --target T --draft D --method M --edges 1,2,4,8,16` starts a
`CloudServer` on this machine twice per edge count (`--max-batch-tokens` as given, then 0), runs
that many edges at once (each its own prompt, all in this process, each edge's draft on a
thread of its own) and prints, per row: total tokens/s (all edges' tokens over the wall time
from the first connection to the last result), per-edge tokens/s (each edge's tokens over its own
session time, averaged) and the server's mean sessions per model pass. Wall-clock numbers on a
shared machine: the edges' drafts share its cores with the server. `--passes` times the
server's side alone instead: one verification pass for N sessions batched vs N passes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import click

from wanspec.net.background import BackgroundLoop
from wanspec.net.client import RemotePair, generate_async
from wanspec.net.server import CloudServer, ServerLimits
from wanspec.protocols.settings import GenerationSettings


@dataclass(frozen=True)
class LoadResult:
    edges: int
    max_batch_tokens: int
    tokens: int
    wall_s: float
    per_edge_tokens_per_s: float
    mean_batch: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def measure(
    pair: Any, edges: int, method: str, settings: GenerationSettings, max_batch_tokens: int
) -> LoadResult:
    """`edges` sessions at once against a fresh server for `pair.target` (see the module)."""
    limits = ServerLimits(max_sessions=max(8, edges))
    with BackgroundLoop("wanspec-cloud") as cloud:
        server = CloudServer(
            pair.target, pair.cloud_info, port=0, limits=limits, max_batch_tokens=max_batch_tokens
        )
        cloud.run(server.start())
        try:
            began = time.perf_counter()
            runs = asyncio.run(_edges(RemotePair.of_pair(pair), server, edges, method, settings))
            wall = time.perf_counter() - began
        finally:
            cloud.run(server.stop(), 30)
    value = server.metrics.value
    passes = value("wanspec:batch_size_count")
    return LoadResult(
        edges=edges,
        max_batch_tokens=max_batch_tokens,
        tokens=sum(len(r.tokens) for r in runs),
        wall_s=wall,
        per_edge_tokens_per_s=sum(len(r.tokens) / r.record.duration_s for r in runs) / edges,
        mean_batch=value("wanspec:batch_size_sum") / passes if passes else 0.0,
    )


def pass_seconds(lm: Any, sessions: int, rows: int = 5, context: int = 64) -> tuple[float, float]:
    """Wall seconds to verify `rows` tokens for each of `sessions` sessions (each with `context`
    cached tokens): (one batched pass, one pass per session). The server side alone, no
    network and no edges; the best of three."""
    from wanspec.jobs import Forward
    from wanspec.models.jobs import run_job, run_jobs_batched

    def once(batched: bool) -> float:
        work = []
        for i in range(sessions):
            session = lm.new_session()
            run_job(session, Forward(0, tuple(range(10 + i, 10 + i + context))))
            work.append((session, Forward(context, tuple(range(100, 100 + rows)), rows)))
        began = time.perf_counter()
        if batched:
            run_jobs_batched(work)
        else:
            for session, job in work:
                run_job(session, job)
        return time.perf_counter() - began

    return min(once(True) for _ in range(3)), min(once(False) for _ in range(3))


async def _edges(
    edge: RemotePair, server: CloudServer, n: int, method: str, settings: GenerationSettings
) -> list[Any]:
    prompts = [f"def f{i}(x):" for i in range(n)]
    return await asyncio.gather(
        *(generate_async(edge, p, method, settings, server.address) for p in prompts)
    )


@click.command()
@click.option("--target", required=True, help="Registry name or Hugging Face folder.")
@click.option("--draft", required=True, help="Registry name or Hugging Face folder.")
@click.option("--method", default="xcosd-e", show_default=True)
@click.option("--edges", default="1,2,4,8,16", show_default=True)
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option("--max-batch-tokens", type=int, default=256, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--passes", is_flag=True, help="Time the server's passes alone instead.")
def main(
    target: str,
    draft: str,
    method: str,
    edges: str,
    max_new_tokens: int,
    max_batch_tokens: int,
    threads: int,
    passes: bool,
) -> None:
    import wanspec

    pair = wanspec.load_pair(target=target, draft=draft, threads=threads)
    if passes:
        click.echo("| sessions | one batched pass, ms | one pass each, ms | speed-up |")
        click.echo("|---|---|---|---|")
        for n in (int(e) for e in edges.split(",")):
            batched, alone = pass_seconds(pair.target, n)
            click.echo(f"| {n} | {1e3 * batched:.0f} | {1e3 * alone:.0f} | {alone / batched:.2f} |")
        return
    settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    measure(pair, 1, method, settings, max_batch_tokens)  # warm-up
    click.echo("| edges | batching | total tokens/s | per-edge tokens/s | sessions per pass |")
    click.echo("|---|---|---|---|---|")
    for n in (int(e) for e in edges.split(",")):
        for budget in (max_batch_tokens, 0):
            r = measure(pair, n, method, settings, budget)
            mode = f"≤ {budget} tokens" if budget else "one at a time"
            click.echo(
                f"| {n} | {mode} | {r.tokens_per_s:.1f} | {r.per_edge_tokens_per_s:.2f} "
                f"| {r.mean_batch:.2f} |"
            )


if __name__ == "__main__":
    main()
