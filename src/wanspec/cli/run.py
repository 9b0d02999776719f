"""`wanspec generate` and `wanspec demo`: text from a method, on the simulator or a real cloud."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from wanspec.cli.options import (
    link_options,
    make_link,
    profile_options,
    server_options,
    settings_from_options,
    settings_options,
)
from wanspec.models.cli import USER_ERRORS, loading_kwargs, loading_options
from wanspec.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET


@click.command()
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
@settings_options()
@loading_options
@profile_options
@click.option(
    "--charge-protocol-cpu",
    is_flag=True,
    help="Also charge each side's own CPU (handlers, codec; measured here) on the virtual "
    "clock, as a real run pays it; the stats gain protocol_cpu_s per side.",
)
@link_options
@server_options
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

    chosen = settings_from_options(settings).to_dict()
    if prompt == "-":
        prompt = sys.stdin.read()
    if server is not None:
        remote = {"token": token, "tls_ca": tls_ca or (True if tls else None)}
        loading = {"dtype": dtype, "invariant": invariant, "device": device}
        _generate_remote(draft, target, prompt, method, server, as_json, remote, chosen, loading)
        return
    try:
        link = make_link(
            link_preset,
            chosen["seed"],
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
            **chosen,
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


@click.command()
@click.option("--target", default=DEFAULT_TARGET, show_default=True)
@click.option("--draft", default=DEFAULT_DRAFT, show_default=True)
@click.option("--prompt", default="def fibonacci(n):", show_default=True)
@settings_options(only=["max_new_tokens"], defaults={"max_new_tokens": 32})  # a short run
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
@link_options
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
            link=make_link(link_preset, 0, **link),
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
