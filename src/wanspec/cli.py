"""The `wanspec` command."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import click

from wanspec import __version__
from wanspec.models.cli import USER_ERRORS, loading_kwargs, loading_options
from wanspec.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from wanspec.protocols.settings import GenerationSettings

SETTINGS = GenerationSettings()  # `generate`'s option defaults are the API's


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wanspec")
def main() -> None:
    """Exactly lossless edge-cloud speculative decoding over a WAN."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def methods(as_json: bool) -> None:
    """List every method with whether it is lossless."""
    from wanspec.protocols.registry import METHODS

    rows = [
        {
            "name": m.name,
            "lossless": m.lossless,
            "aliases": list(m.aliases),
            "vocab": "shared only" if m.shared_vocab_only else "shared or heterogeneous (TLI)",
            "source": m.source,
            "description": m.description,
        }
        for m in METHODS.values()
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    table = [
        (
            r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else ""),
            "yes" if r["lossless"] else "no",
            r["vocab"],
            r["description"],
        )
        for r in rows
    ]
    header = ("method", "lossless", "vocabulary", "description")
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(3)]
    for row in [header, *table]:
        cells = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
        click.echo("  ".join([*cells, row[3]]))


def _profile_options(f: Any) -> Any:
    """--edge-profile / --cloud-profile, shared by every command that times a run."""
    for side, example in (("cloud", "cloud-a100-8b"), ("edge", "cpu-measured, edge-orin")):
        f = click.option(
            f"--{side}-profile",
            default="measured",
            show_default=True,
            help=f"{side.capitalize()} compute profile: a name (e.g. {example}) or a JSON path.",
        )(f)
    return f


def _link_options(f: Any) -> Any:
    options = [
        click.option(
            "--bandwidth",
            "bandwidth_bps",
            type=float,
            default=100e6,
            show_default=True,
            help="Link bandwidth, bits/s (both directions unless overridden).",
        ),
        click.option("--uplink", "uplink_bps", type=float, default=None, help="Uplink bits/s."),
        click.option(
            "--downlink", "downlink_bps", type=float, default=None, help="Downlink bits/s."
        ),
        click.option(
            "--rtt",
            "rtt_s",
            type=float,
            default=0.05,
            show_default=True,
            help="Round-trip time, seconds.",
        ),
        click.option(
            "--jitter",
            "jitter_s",
            type=float,
            default=0.0,
            show_default=True,
            help="Jitter of each one-way delay, seconds.",
        ),
        click.option(
            "--loss",
            type=float,
            default=0.0,
            show_default=True,
            help="Per-segment loss probability, each failed attempt costing one RTT.",
        ),
        click.option(
            "--link",
            "link_preset",
            default=None,
            help="A named WAN preset (overrides the numbers above).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _server_options(f: Any) -> Any:
    """--server and how to reach it (token, TLS), for the commands that can use a real cloud."""
    options = [
        click.option(
            "--server",
            metavar="HOST:PORT",
            default=None,
            help="Run the target on this `wanspec serve` server instead of simulating it.",
        ),
        click.option(
            "--token",
            envvar="WANSPEC_TOKEN",
            default=None,
            help="Bearer token for the server [default: $WANSPEC_TOKEN].",
        ),
        click.option("--tls", is_flag=True, help="Use TLS, trusting the system's CAs."),
        click.option(
            "--tls-ca",
            type=click.Path(exists=True, dir_okay=False),
            default=None,
            help="Use TLS, trusting only this CA (PEM); a self-signed server cert works here.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _make_link(link_preset: str | None, seed: int, **numbers: Any) -> Any:
    from wanspec.sim import Link
    from wanspec.sim import link_preset as preset

    if link_preset:
        return preset(link_preset, seed=seed)
    return Link(seed=seed, **numbers)


@main.command()
@click.option(
    "--target",
    default=DEFAULT_TARGET,
    show_default=True,
    help="Target model: registry name or local Hugging Face folder (with --server the edge "
    "loads only its tokenizer).",
)
@click.option(
    "--draft",
    default=DEFAULT_DRAFT,
    show_default=True,
    help="Draft model: registry name or local Hugging Face folder.",
)
@click.option("--method", default="xcosd-e", show_default=True, help="See `wanspec methods`.")
@click.option("--prompt", required=True, help="Prompt text ('-' reads standard input).")
@click.option("--max-new-tokens", type=int, default=SETTINGS.max_new_tokens, show_default=True)
@click.option("--temperature", type=float, default=SETTINGS.temperature, show_default=True)
@click.option("--top-k", type=int, default=SETTINGS.top_k, show_default=True, help="0 = off.")
@click.option("--top-p", type=float, default=SETTINGS.top_p, show_default=True, help="1.0 = off.")
@click.option("--seed", type=int, default=SETTINGS.seed, show_default=True)
@click.option("--gamma", type=int, default=SETTINGS.gamma, show_default=True, help="Draft length.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option(
    "--srdv-k", type=int, default=SETTINGS.srdv_k, show_default=True, help="X-CoSD-E candidates K."
)
@click.option(
    "--srdv-m", type=int, default=SETTINGS.srdv_m, show_default=True, help="X-CoSD-E rounds M."
)
@click.option(
    "--q-bits",
    type=int,
    default=SETTINGS.q_bits,
    show_default=True,
    help="Precision of a q shipped to the edge (16, 24 or 32; 16 = the papers' bits).",
)
@loading_options
@_profile_options
@click.option(
    "--charge-protocol-cpu",
    is_flag=True,
    help="Also charge each side's own CPU (handlers, codec; measured here) on the virtual "
    "clock, as a real run pays it; the stats gain protocol_cpu_s per side.",
)
@_link_options
@_server_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the stats.")
def generate(
    target: str,
    draft: str,
    method: str,
    prompt: str,
    as_json: bool,
    dtype: str,
    invariant: bool | None,
    device: str,
    server: str | None,
    token: str | None,
    tls: bool,
    tls_ca: str | None,
    edge_profile: str,
    cloud_profile: str,
    charge_protocol_cpu: bool,
    link_preset: str | None,
    bandwidth_bps: float,
    uplink_bps: float | None,
    downlink_bps: float | None,
    rtt_s: float,
    jitter_s: float,
    loss: float,
    **settings: Any,
) -> None:
    """Generate text with a method over a simulated WAN (virtual time, real models), or with
    --server against a `wanspec serve` target over real TCP (wall clock; the edge then needs
    only the target's tokenizer, the link, profile and CPU options do not apply, and --dtype,
    --invariant and --device load the draft only: the server chose its target's)."""
    import wanspec

    if prompt == "-":
        prompt = sys.stdin.read()
    settings["stop"] = tuple(settings["stop"])
    if server is not None:
        remote = {"token": token, "tls_ca": tls_ca or (True if tls else None)}
        loading = {"dtype": dtype, "invariant": invariant, "device": device}
        _generate_remote(draft, target, prompt, method, server, as_json, remote, settings, loading)
        return
    try:
        link = _make_link(
            link_preset,
            settings["seed"],
            bandwidth_bps=bandwidth_bps,
            uplink_bps=uplink_bps,
            downlink_bps=downlink_bps,
            rtt_s=rtt_s,
            jitter_s=jitter_s,
            loss=loss,
        )
        loading = loading_kwargs(dtype, invariant, device)
        pair = wanspec.load_pair(target=target, draft=draft, **loading)
        result = wanspec.generate(
            pair,
            prompt,
            method=method,
            link=link,
            edge_profile=edge_profile,
            cloud_profile=cloud_profile,
            charge_protocol_cpu=charge_protocol_cpu,
            **settings,
        )
    except USER_ERRORS as err:
        raise click.ClickException(str(err)) from err
    _print_result(result, as_json)


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        payload = {"text": result.text, "token_ids": result.token_ids, "stats": result.stats}
        click.echo(json.dumps(payload, ensure_ascii=False))
    else:
        click.echo(result.text)


def _generate_remote(
    draft: str,
    target: str,
    prompt: str,
    method: str,
    server: str,
    as_json: bool,
    remote: dict[str, Any],
    settings: dict[str, Any],
    loading: dict[str, Any],
) -> None:
    import wanspec
    from wanspec.models.lm import load_model
    from wanspec.models.registry import resolve_model
    from wanspec.net.client import ClientOptions, RemoteError, load_edge

    try:
        draft_lm = load_model(resolve_model(draft), **loading_kwargs(**loading))
        edge = load_edge(draft_lm, target, server, ClientOptions(**remote), draft_name=draft)
        result = wanspec.generate(edge, prompt, method, server=server, **remote, **settings)
    except (*USER_ERRORS, RemoteError) as err:
        raise click.ClickException(str(err)) from err
    _print_result(result, as_json)


@main.command()
@click.option("--target", default=DEFAULT_TARGET, show_default=True)
@click.option("--draft", default=DEFAULT_DRAFT, show_default=True)
@click.option("--prompt", default="def fibonacci(n):", show_default=True)
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option(
    "--edge-profile",
    default="edge-orin-opt",
    show_default=True,
    help="Edge compute profile of the simulated projection.",
)
@click.option(
    "--cloud-profile",
    default="cloud-a100x4-70b",
    show_default=True,
    help="Cloud compute profile of the simulated projection.",
)
@click.option(
    "--methods",
    default=None,
    metavar="M1,M2,…",
    help="Methods to run, 'ar' first [ar,naive,xcosd,xcosd-e; +sd for a shared vocabulary].",
)
@click.option(
    "--shared-win/--no-shared-win",
    default=True,
    show_default=True,
    help="Then run ar and sd (γ=3) over TCP on Qwen2.5-Coder 0.5B → 1.5B at a 10 ms RTT, the "
    "setting where speculation beats the target alone on a small CPU.",
)
@loading_options
@_link_options
def demo(
    target: str,
    draft: str,
    prompt: str,
    max_new_tokens: int,
    edge_profile: str,
    cloud_profile: str,
    methods: str | None,
    shared_win: bool,
    dtype: str,
    invariant: bool | None,
    device: str,
    link_preset: str | None,
    **link: Any,
) -> None:
    """The main job on the bundled pair: a server, a WAN proxy and the edge on this machine, a
    few methods over real TCP on one prompt, beside the simulator's projection of the same runs
    on an edge device and a data-centre GPU; then the shared pair's real win (`--shared-win`)."""
    from wanspec.bench.demo import run_demo, run_shared_win

    try:
        run_demo(
            target=target,
            draft=draft,
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            link=_make_link(link_preset, 0, **link),
            edge_profile=edge_profile,
            cloud_profile=cloud_profile,
            methods=tuple(m.strip() for m in methods.split(",")) if methods else None,
            echo=click.echo,
            **loading_kwargs(dtype, invariant, device),
        )
        if shared_win:
            run_shared_win(
                prompt=prompt,
                max_new_tokens=max_new_tokens,
                echo=click.echo,
                **loading_kwargs(dtype, invariant, device),
            )
    except USER_ERRORS as err:
        raise click.ClickException(str(err)) from err


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


@main.command("wan-proxy")
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


@main.command()
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


def _attach_optional_groups() -> None:
    from wanspec.bench.cli import bench
    from wanspec.edge_service.cli import edge
    from wanspec.models.cli import models

    main.add_command(models)
    main.add_command(bench)
    main.add_command(edge)


_attach_optional_groups()

if __name__ == "__main__":
    main()
