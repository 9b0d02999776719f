"""The `wanspec` command."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from wanspec import __version__

DEFAULT_TARGET = "qwen2.5-coder-0.5b"
DEFAULT_DRAFT = "smollm2-135m"


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
    click.echo(f"{'method':<10} {'lossless':<9} {'vocabulary':<32} description")
    for r in rows:
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
        lossless = "yes" if r["lossless"] else "no"
        click.echo(f"{name:<10} {lossless:<9} {r['vocab']:<32} {r['description']}")


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by what the user asked for: shown as a message, not a traceback."""
    from wanspec.assets import AssetError
    from wanspec.models.registry import ModelError

    return (ValueError, FileNotFoundError, ModelError, AssetError)


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
            help="Per-message loss probability (resent after a timeout).",
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
    help="Target model: registry name or local Hugging Face folder.",
)
@click.option(
    "--draft",
    default=DEFAULT_DRAFT,
    show_default=True,
    help="Draft model: registry name or local Hugging Face folder.",
)
@click.option("--method", default="xcosd-e", show_default=True, help="See `wanspec methods`.")
@click.option("--prompt", required=True, help="Prompt text ('-' reads standard input).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1.0 = off.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--gamma", type=int, default=4, show_default=True, help="Draft length.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--srdv-k", type=int, default=4, show_default=True, help="X-CoSD-E candidates K.")
@click.option("--srdv-m", type=int, default=2, show_default=True, help="X-CoSD-E rounds M.")
@_profile_options
@_link_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the stats.")
def generate(
    target: str,
    draft: str,
    method: str,
    prompt: str,
    as_json: bool,
    edge_profile: str,
    cloud_profile: str,
    link_preset: str | None,
    bandwidth_bps: float,
    uplink_bps: float | None,
    downlink_bps: float | None,
    rtt_s: float,
    jitter_s: float,
    loss: float,
    **settings: Any,
) -> None:
    """Generate text with a method over a simulated WAN (virtual time, real models)."""
    import wanspec

    if prompt == "-":
        prompt = sys.stdin.read()
    settings["stop"] = tuple(settings["stop"])
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
        pair = wanspec.load_pair(target=target, draft=draft)
        result = wanspec.generate(
            pair,
            prompt,
            method=method,
            link=link,
            edge_profile=edge_profile,
            cloud_profile=cloud_profile,
            **settings,
        )
    except _user_errors() as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        payload = {"text": result.text, "token_ids": result.token_ids, "stats": result.stats}
        click.echo(json.dumps(payload, ensure_ascii=False))
    else:
        click.echo(result.text)


@main.command()
@click.option("--target", default=DEFAULT_TARGET, show_default=True)
@click.option("--draft", default=DEFAULT_DRAFT, show_default=True)
@click.option("--prompt", default="def fibonacci(n):", show_default=True)
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@_profile_options
@_link_options
def demo(
    target: str,
    draft: str,
    prompt: str,
    max_new_tokens: int,
    edge_profile: str,
    cloud_profile: str,
    link_preset: str | None,
    **link: Any,
) -> None:
    """The main job on the bundled defaults: every lossless method, one prompt, one WAN."""
    from wanspec.bench.demo import run_demo

    try:
        run_demo(
            target=target,
            draft=draft,
            prompt=prompt,
            max_new_tokens=max_new_tokens,
            link=_make_link(link_preset, 0, **link),
            edge_profile=edge_profile,
            cloud_profile=cloud_profile,
            echo=click.echo,
        )
    except _user_errors() as err:
        raise click.ClickException(str(err)) from err


def _attach_optional_groups() -> None:
    from wanspec.models.cli import models

    main.add_command(models)


_attach_optional_groups()

if __name__ == "__main__":
    main()
