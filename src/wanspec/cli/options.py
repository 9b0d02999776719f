"""Option groups shared by the `wanspec` commands: the link, compute profiles, a real server,
and the generation settings' (from `wanspec.settings_cli`, where the benchmarks and the edge
service find them too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from wanspec.settings_cli import (
    SETTING_FIELDS,
    option_name,
    settings_from_options,
    settings_options,
)

__all__ = [
    "SETTING_FIELDS",
    "link_options",
    "make_link",
    "option_name",
    "profile_options",
    "server_options",
    "settings_from_options",
    "settings_options",
]

F = TypeVar("F", bound=Callable[..., Any])


def profile_options(f: F) -> F:
    """--edge-profile / --cloud-profile, shared by every command that times a run."""
    for side, example in (("cloud", "cloud-a100-8b"), ("edge", "cpu-measured, edge-orin")):
        f = click.option(
            f"--{side}-profile",
            default="measured",
            show_default=True,
            help=f"{side.capitalize()} compute profile: a name (e.g. {example}) or a JSON path.",
        )(f)
    return f


def link_options(f: F) -> F:
    """The simulated link's numbers, or a named preset; `make_link` builds it."""
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


def make_link(link_preset: str | None, seed: int, **numbers: Any) -> Any:
    """The `wanspec.sim.Link` that `link_options` describe."""
    from wanspec.sim import Link
    from wanspec.sim import link_preset as preset

    if link_preset:
        return preset(link_preset, seed=seed)
    return Link(seed=seed, **numbers)


def server_options(f: F) -> F:
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
