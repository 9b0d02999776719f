"""The generation settings as command-line options, for every command that takes one
(`wanspec generate` and `demo`, `wanspec edge`, the benchmarks).

The options are generated from `GenerationSettings` itself (each field's type, default and `help`
metadata), so a new setting is a new option and a default or help text cannot drift between
commands; each value is checked by the dataclass as it is parsed, and its error becomes a usage
error naming the option. It lives below `wanspec.cli`, `wanspec.bench` and `wanspec.edge_service`
so that each of them can use it (`wanspec.cli` attaches the other two).
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
    flags: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """One option per `GenerationSettings` field (`only` those, in that order, less `exclude`;
    else every field in field order), each checked by the dataclass as it is parsed.

    A command may differ only where it must: `defaults` gives its own default for a setting
    (e.g. a short demo run; None: not given unless typed, the command then uses its own),
    `flags` its own spelling of one (kept for existing users), and `notes` what the setting
    means there, after the field's help."""
    names = list(SETTING_FIELDS) if only is None else list(only)
    given = {*names, *(defaults or {}), *(flags or {}), *(notes or {})}
    unknown = given - set(SETTING_FIELDS)
    if unknown:
        raise ValueError(f"not generation settings: {sorted(unknown)}")
    chosen = [name for name in names if name not in set(exclude)]
    overrides, spellings, said = dict(defaults or {}), dict(flags or {}), dict(notes or {})

    def decorate(f: F) -> F:
        for name in reversed(chosen):
            default = overrides.get(name, SETTING_FIELDS[name].default)
            flag = spellings.get(name, option_name(name))
            f = _setting_option(name, default, flag, said.get(name))(f)
        return f

    return decorate


def _setting_option(name: str, default: Any, flag: str, note: str | None) -> Callable[[F], F]:
    kind = _TYPES[name]
    help_text = SETTING_FIELDS[name].metadata["help"] + (f" {note}" if note else "")
    checked = {"callback": _check_setting}
    if kind is bool:
        if default:  # on by default: only the --no- form says anything
            return click.option(
                f"{flag}/--no-{flag[2:]}",
                name,
                default=True,
                show_default="on",
                help=help_text,
                **checked,
            )
        return click.option(flag, name, is_flag=True, help=help_text, **checked)
    if kind == tuple[str, ...]:
        extra = {"default": default} if default else {}
        return click.option(flag, name, multiple=True, help=help_text, **checked, **extra)
    if kind not in (int, float, str):
        raise TypeError(f"no command-line form for setting {name}: {kind}")
    shown = {"show_default": True} if default is not None else {}
    if SETTING_FIELDS[name].metadata.get("auto"):
        kind = IntOrAuto()
    return click.option(flag, name, type=kind, default=default, help=help_text, **checked, **shown)


class IntOrAuto(click.ParamType):
    """An integer, or `auto` for a setting the run may choose online."""

    name = "integer|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "auto" or isinstance(value, int):
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor 'auto'", param, ctx)


def _check_setting(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """The dataclass's own check of one parsed setting (None: not given), so that a bad value is
    a usage error naming the option as this command spells it, before anything loads."""
    if value is not None:
        try:
            GenerationSettings(**{str(param.name): value})
        except ValueError as err:
            raise click.BadParameter(str(err)) from err
    return value


def settings_from_options(options: Mapping[str, Any]) -> GenerationSettings:
    """The settings that parsed `settings_options` values make (the rest at their defaults); each
    value was checked by its option, so what is left to refuse is a rule across settings."""
    try:
        return GenerationSettings(**{**options, "stop": tuple(options.get("stop", ()))})
    except ValueError as err:
        raise click.UsageError(str(err)) from err
