"""`wanspec wan-proxy` and `wanspec serve`: the network's two long-running processes."""

from __future__ import annotations

import math
from typing import Any

import click

from wanspec.models.cli import USER_ERRORS, loading_kwargs, loading_options
from wanspec.models.registry import DEFAULT_TARGET


def _parsed(kind: str) -> Any:
    """A click callback that parses a value with `wanspec.net.units.parse_<kind>` (lazily, so
    that other commands never import it); its ValueError becomes a usage error."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        from wanspec.net import units

        try:
            return None if value is None else getattr(units, f"parse_{kind}")(value)
        except ValueError as err:
            raise click.BadParameter(str(err)) from err

    return callback


def wan_proxy_specs(link_preset: str | None, **given: Any) -> Any:
    """(up, down) `DirectionSpec`s: a `--link` preset (or an unlimited, zero-delay link) with
    every option the user gave on top. Keys: up_bw, down_bw (bits/s), rtt, jitter, rto (s), loss."""
    from wanspec.link import DirectionSpec

    chosen: dict[str, Any] = {"up_bw": math.inf, "down_bw": math.inf, "rtt": 0.0}
    chosen.update(jitter=0.0, loss=0.0, rto=None)
    if link_preset:
        from wanspec.sim.link import link_preset as preset

        link = preset(link_preset)
        chosen.update(up_bw=link.up_bps, down_bw=link.down_bps, rtt=link.rtt_s)
        chosen.update(jitter=link.jitter_s, loss=link.loss, rto=link.retransmit_s)
    chosen.update({key: value for key, value in given.items() if value is not None})
    shared = (chosen["rtt"] / 2, chosen["jitter"], chosen["loss"], chosen["rto"])
    return DirectionSpec(chosen["up_bw"], *shared), DirectionSpec(chosen["down_bw"], *shared)


def _host_port(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    from wanspec.net.units import parse_address

    try:
        return parse_address(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err


@click.command("wan-proxy")
@click.option(
    "--listen",
    required=True,
    callback=_host_port,
    metavar="HOST:PORT",
    help="HOST:PORT to accept on.",
)
@click.option(
    "--upstream",
    required=True,
    callback=_host_port,
    metavar="HOST:PORT",
    help="HOST:PORT to relay to.",
)
@click.option(
    "--up-bw", callback=_parsed("rate"), metavar="RATE", help="Client→upstream rate, e.g. 1mbit."
)
@click.option(
    "--down-bw", callback=_parsed("rate"), metavar="RATE", help="Upstream→client rate, e.g. 10mbit."
)
@click.option(
    "--rtt", callback=_parsed("duration"), metavar="TIME", help="Round-trip delay, e.g. 50ms."
)
@click.option(
    "--jitter",
    callback=_parsed("duration"),
    metavar="TIME",
    help="Half-normal jitter per direction.",
)
@click.option(
    "--loss",
    type=click.FloatRange(0, 1, max_open=True),
    help="Per-segment loss probability, felt as retransmission delay.",
)
@click.option(
    "--rto", callback=_parsed("duration"), metavar="TIME", help="Retransmission timeout [one RTT]."
)
@click.option("--link", "link_preset", metavar="PRESET", help="A named WAN preset (e.g. wan-4g).")
@click.option("--seed", type=int, default=0, show_default=True)
def wan_proxy(
    listen: tuple[str, int],
    upstream: tuple[str, int],
    link_preset: str | None,
    seed: int,
    **given: Any,
) -> None:
    """Relay TCP through an emulated WAN link (rate, delay, jitter, loss); Ctrl-C stops it."""
    import asyncio

    from wanspec.net.proxy import ConnectionStats, WanProxy
    from wanspec.net.service import serve_until_signalled

    try:
        up, down = wan_proxy_specs(link_preset, **given)
    except ValueError as err:
        raise click.ClickException(str(err)) from err

    def closed(c: ConnectionStats) -> None:
        took = (c.closed_s or c.opened_s) - c.opened_s
        why = f" ({c.error})" if c.error else ""
        click.echo(f"connection {c.id} closed after {took:.1f} s: up {c.up.bytes} B, "
                   f"down {c.down.bytes} B{why}")  # fmt: skip

    def ready(p: WanProxy) -> None:
        host, port = p.address
        click.echo(f"wan-proxy listening on {host}:{port}, relaying to {upstream[0]}:{upstream[1]}")
        click.echo(f"  up   {up.describe()}\n  down {down.describe()}\n  seed {seed}; Ctrl-C stops")

    proxy = WanProxy(listen, upstream, up, down, seed=seed, on_close=closed)
    try:
        asyncio.run(serve_until_signalled(proxy, ready))
    except OSError as err:
        raise click.ClickException(f"cannot listen on {listen[0]}:{listen[1]}: {err}") from err
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        pass
    click.echo("wan-proxy stopped")


def _default_draft_tokenizers(target: str) -> tuple[str, ...]:
    """The bundled draft's tokenizer for a registry target of another family, else none."""
    from wanspec.models.registry import MODELS

    spec = MODELS.get(target)
    return ("smollm2",) if spec is not None and spec.family != "smollm2" else ()


@click.command()
@click.option(
    "--target",
    default=DEFAULT_TARGET,
    show_default=True,
    help="Target model: registry name or local Hugging Face folder.",
)
@click.option(
    "--draft-tokenizer",
    "draft_tokenizers",
    multiple=True,
    metavar="NAME_OR_PATH",
    help="A draft tokenizer to verify drafts of, besides the target's own (repeatable; "
    "default for a registry target: smollm2).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=7070, show_default=True)
@click.option(
    "--token",
    envvar="WANSPEC_TOKEN",
    default=None,
    help="Require this bearer token of every edge [default: $WANSPEC_TOKEN; unset: none].",
)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="PEM cert chain.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@click.option("--max-sessions", type=click.IntRange(1), default=8, show_default=True)
@click.option(
    "--max-frame", type=click.IntRange(64), default=8 << 20, show_default=True, help="Bytes."
)
@click.option("--max-new-tokens", type=click.IntRange(1), default=4096, show_default=True)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(1),
    default=None,
    help="Refuse a prompt of more tokens (LIMIT) [default: only the target's context length].",
)
@click.option(
    "--idle-timeout",
    callback=_parsed("duration"),
    default="60s",
    show_default=True,
    help="How long an edge may stay silent while nothing computes for it.",
)
@click.option(
    "--request-timeout",
    callback=_parsed("duration"),
    default="600s",
    show_default=True,
    help="How long one session may last.",
)
@click.option(
    "--resume-grace",
    "resume_grace_s",
    callback=_parsed("duration"),
    default="30s",
    show_default=True,
    help="How long a resumable session whose edge dropped waits for it to reconnect.",
)
@click.option(
    "--max-held-sessions",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Resumable sessions held for an edge that dropped, beside --max-sessions; past it the "
    "one held longest ends.",
)
@click.option(
    "--max-pending-handshakes",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Connections that have not shaken hands yet; past it the oldest gives way, or the "
    "newcomer gets BUSY.",
)
@click.option(
    "--max-kv-memory",
    "max_kv_bytes",
    callback=_parsed("size"),
    default=None,
    metavar="SIZE",
    help="KV-cache budget of all open sessions together (bytes, or 512MiB, 2GiB, 4G): a session "
    "whose estimate (prompt + max_new_tokens tokens) does not fit gets LIMIT [default: none].",
)
@click.option("--threads", type=click.IntRange(1), default=None, help="Torch threads [2].")
@loading_options
@click.option(
    "--max-batch-tokens",
    type=click.IntRange(0),
    default=256,
    show_default=True,
    help="Verify the sessions' queued drafts as one forward pass of at most this many (padded) "
    "tokens; 0 = one job at a time.",
)
@click.option("--no-batching", is_flag=True, help="Same as --max-batch-tokens 0.")
@click.option(
    "--prefill-chunk",
    type=click.IntRange(0),
    default=256,
    show_default=True,
    help="Run a longer prompt's prefill in pieces of this many tokens, the other sessions' jobs "
    "between them; 0 = in one pass.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (HOST as --host).",
)
def serve(
    target: str,
    draft_tokenizers: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    threads: int | None,
    dtype: str,
    invariant: bool | None,
    device: str,
    idle_timeout: float,
    request_timeout: float,
    max_batch_tokens: int,
    no_batching: bool,
    prefill_chunk: int,
    metrics_port: int | None,
    max_prompt_tokens: int | None,
    **limits: Any,
) -> None:
    """Serve a target model to edges over TCP; Ctrl-C ends open sessions with 'shutdown'."""
    import asyncio
    import dataclasses
    import logging

    from wanspec.net.server import (
        CloudServer,
        ServerLimits,
        build_target_info,
        format_bytes,
        server_tls,
    )
    from wanspec.net.service import serve_until_signalled

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        from wanspec.models.invariant import is_batch_invariant
        from wanspec.models.lm import load_model
        from wanspec.models.registry import load_tokenizer, resolve_model

        loading = loading_kwargs(dtype, invariant, device)
        target_lm = load_model(resolve_model(target), threads=threads, **loading)
        drafts = draft_tokenizers or _default_draft_tokenizers(target)
        info = build_target_info(target_lm, [load_tokenizer(name) for name in drafts])
        info = dataclasses.replace(info, max_prompt_tokens=max_prompt_tokens)
        tls = server_tls(tls_cert, tls_key) if tls_cert and tls_key else None
        limits["idle_timeout_s"], limits["request_timeout_s"] = idle_timeout, request_timeout
        rules = ServerLimits(**limits)
        address = {"host": host, "port": port}
        batching = {
            "max_batch_tokens": 0 if no_batching else max_batch_tokens,
            "prefill_chunk": prefill_chunk,
        }
        server = CloudServer(
            target_lm, info, **address, token=token, tls=tls, limits=rules, **batching
        )
    except USER_ERRORS as err:
        raise click.ClickException(str(err)) from err

    def ready(s: CloudServer) -> None:
        where = "{}:{}".format(*s.address)
        security = ", ".join(x for x in ("TLS" if tls else "", "token" if token else "") if x)
        accepted = ", ".join(("the target's", *drafts))
        click.echo(f"serving {target} on {where} ({security or 'no TLS, no token'})")
        click.echo(f"  draft tokenizers: {accepted}; Ctrl-C stops")
        limit = batching["max_batch_tokens"]
        click.echo(f"  batching: {f'up to {limit} tokens per pass' if limit else 'off'}")
        chunk = f"in pieces of {prefill_chunk} tokens" if prefill_chunk else "in one pass"
        kv = rules.max_kv_bytes
        budget = f"{format_bytes(kv)} for all sessions" if kv is not None else "none"
        click.echo(f"  prefill: {chunk}; KV-cache budget: {budget}")
        kernels = "pass-shape invariant" if is_batch_invariant(target_lm.model) else "default"
        click.echo(f"  model: {dtype}, {kernels} kernels on {target_lm.device}")
        if metrics_port is not None:
            bound = s.metrics.serve_http(metrics_port, host)
            click.echo(f"  metrics: http://{host}:{bound}/metrics")

    try:
        asyncio.run(serve_until_signalled(server, ready))
    except OSError as err:
        raise click.ClickException(f"cannot listen on {host}:{port}: {err}") from err
    except KeyboardInterrupt:
        pass
    server.metrics.stop_http()
    click.echo("server stopped")
