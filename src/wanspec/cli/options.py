"""Option groups shared by the `wanspec` commands.

The generation settings' options are generated from `GenerationSettings` itself (each field's
type, default and `help` metadata), so a new setting is a new option and a default cannot drift;
values are checked by the dataclass, and its error becomes a usage error naming the option.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, fields
from typing import Any, TypeVar, get_type_hints

import click

from wanspec.protocols.settings import GenerationSettings

F = TypeVar("F", bound=Callable[..., Any])

SETTING_FIELDS: dict[str, Field[Any]] = {f.name: f for f in fields(GenerationSettings)}
_TYPES = get_type_hints(GenerationSettings)


def option_name(setting: str) -> str:
    """The command-line spelling of a setting: `max_new_tokens` → `--max-new-tokens`."""
    return "--" + setting.replace("_", "-")


def settings_options(
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[F], F]:
    """One option per `GenerationSettings` field (`only` those, less `exclude`), in field order.

    `defaults` gives a command its own default for a setting (e.g. a short demo run)."""
    names = list(SETTING_FIELDS) if only is None else list(only)
    unknown = set(names) - set(SETTING_FIELDS)
    if unknown:
        raise ValueError(f"not generation settings: {sorted(unknown)}")
    chosen = [name for name in names if name not in set(exclude)]
    overrides = dict(defaults or {})

    def decorate(f: F) -> F:
        for name in reversed(chosen):
            default = overrides.get(name, SETTING_FIELDS[name].default)
            f = _setting_option(name, default)(f)
        return f

    return decorate


def _setting_option(name: str, default: Any) -> Callable[[F], F]:
    kind = _TYPES[name]
    flag, help_text = option_name(name), SETTING_FIELDS[name].metadata["help"]
    if kind is bool:
        if default:  # on by default: only the --no- form says anything
            return click.option(
                f"{flag}/--no-{flag[2:]}", name, default=True, show_default="on", help=help_text
            )
        return click.option(flag, name, is_flag=True, help=help_text)
    if kind == tuple[str, ...]:
        extra = {"default": default} if default else {}
        return click.option(flag, name, multiple=True, help=help_text, **extra)
    if kind not in (int, float, str):
        raise TypeError(f"no command-line form for setting {name}: {kind}")
    return click.option(flag, name, type=kind, default=default, show_default=True, help=help_text)


def settings_from_options(options: Mapping[str, Any]) -> GenerationSettings:
    """The settings that parsed `settings_options` values make (the rest at their defaults); a
    value the dataclass refuses is a usage error naming the option."""
    try:
        return GenerationSettings(**{**options, "stop": tuple(options.get("stop", ()))})
    except ValueError as err:
        message = str(err)
        for name in SETTING_FIELDS:
            if message.startswith((f"invalid setting {name}=", f"invalid setting {name}:")):
                raise click.BadParameter(message, param_hint=f"'{option_name(name)}'") from err
        raise click.UsageError(message) from err


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
