"""The `wanspec` command: version, method list, generate on tiny real models, clear errors, and
options for the generation settings that follow `GenerationSettings`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import fields
from typing import get_type_hints

import click
import pytest
from click.testing import CliRunner

from wanspec.bench.registry import ALIASES, EXPERIMENTS
from wanspec.cli import main
from wanspec.cli.options import option_name, settings_from_options
from wanspec.protocols.registry import METHODS
from wanspec.protocols.settings import GenerationSettings

# Commands whose option named after a setting has a default of its own, on purpose: a short
# demo or comparison, and the server's cap on what a request may ask for; None: not given unless
# typed (the benchmark's configuration, or the method, then decides).
OWN_DEFAULTS = {
    ("demo", "max_new_tokens"): 32,
    ("bench overhead", "max_new_tokens"): 64,
    ("bench overhead", "tree_budget"): None,
    ("bench realsim", "max_new_tokens"): 24,
    ("serve", "max_new_tokens"): 4096,
    **{
        (f"bench {experiment}", setting): None
        for experiment in [*EXPERIMENTS, *ALIASES]
        for setting in ("max_new_tokens", "srdv_k", "srdv_m")
    },
}
# Flags a command spells its own way, kept for its users.
OWN_FLAGS = {
    ("bench overhead", "max_new_tokens"): "--tokens",
    ("bench realsim", "max_new_tokens"): "--tokens",
}
# Options named after a setting that are something else.
NOT_SETTINGS = {
    ("serve", "max_new_tokens"): "the server's cap on what a request may ask for",
    ("wan-proxy", "seed"): "the seed of the proxy's own delay and loss draws",
}


def test_console_script_prints_version() -> None:
    exe = shutil.which("wanspec") or f"{sys.prefix}/bin/wanspec"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("wanspec, version ")


def test_methods_lists_every_method_with_losslessness() -> None:
    result = CliRunner().invoke(main, ["methods", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r["lossless"] for r in json.loads(result.output)}
    assert rows == {name: m.lossless for name, m in METHODS.items()}
    assert rows["xcosd-e"] is True and rows["gr"] is False
    table = CliRunner().invoke(main, ["methods"]).output
    assert all(name in table for name in METHODS)


def test_methods_table_columns_align_for_names_with_aliases() -> None:
    header, *lines = CliRunner().invoke(main, ["methods"]).output.splitlines()
    assert len(lines) == len(METHODS)
    lossless_at, vocab_at = header.index("lossless"), header.index("vocabulary")
    for line, m in zip(lines, METHODS.values(), strict=True):
        name = m.name + (f" ({', '.join(m.aliases)})" if m.aliases else "")
        assert line[:lossless_at].rstrip() == name and line[lossless_at - 1] == " ", line
        assert line[lossless_at:vocab_at].rstrip() == ("yes" if m.lossless else "no"), line
        assert line[vocab_at - 1] == " " and line[vocab_at] != " ", line
    assert any(m.aliases for m in METHODS.values())  # the case that used to push columns right


def test_methods_describe_srdv_fallback_on_the_cloud_not_hr() -> None:
    output = CliRunner().invoke(main, ["methods", "--json"]).output
    rows = {r["name"]: r for r in json.loads(output)}
    for name in ("xcosd-e", "acespec-x"):
        description = rows[name]["description"]
        assert "HR" not in description and "p̃" in description, description


def test_generate_json_on_tiny_pair(tiny_pair_hetero) -> None:
    draft, target = tiny_pair_hetero
    args = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--method",
        "xcosd",
        "--prompt",
        "hello world",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
        "--bandwidth",
        "1e6",
        "--rtt",
        "0.1",
        "--json",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert len(payload["token_ids"]) == payload["stats"]["new_tokens"] == 6
    assert payload["stats"]["method"] == "xcosd"
    assert payload["stats"]["time_s"] >= 0.1


def test_generate_rejects_bad_method_and_settings(tiny_pair_shared) -> None:
    draft, target = tiny_pair_shared
    base = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "hi"]
    bad_method = CliRunner().invoke(main, [*base, "--method", "nope"])
    assert bad_method.exit_code != 0 and "unknown method" in bad_method.output
    bad_gamma = CliRunner().invoke(main, [*base, "--gamma", "0"])
    assert bad_gamma.exit_code != 0 and "gamma" in bad_gamma.output
    bad_link = CliRunner().invoke(main, [*base, "--bandwidth", "-5"])
    assert bad_link.exit_code != 0 and "bandwidth" in bad_link.output
    bad_bits = CliRunner().invoke(main, [*base, "--q-bits", "12"])
    assert bad_bits.exit_code != 0 and "q_bits" in bad_bits.output


def test_generate_q_bits_reaches_the_run(tiny_pair_shared) -> None:
    """--q-bits sets the precision of the q the cloud ships: 16-bit q costs fewer downlink
    bits than the default 32 on the same greedy run (same tokens, only the rounding differs)."""
    draft, target = tiny_pair_shared
    base = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "hello",
            "--method", "naive", "--max-new-tokens", "8", "--json"]  # fmt: skip
    runs = {bits: CliRunner().invoke(main, [*base, "--q-bits", bits]) for bits in ("16", "32")}
    stats = {bits: json.loads(r.output)["stats"] for bits, r in runs.items()}
    assert stats["16"]["tv_bound"] > stats["32"]["tv_bound"] >= 0


def test_generate_unknown_model_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["generate", "--target", "no-such-model", "--prompt", "x"])
    assert result.exit_code != 0
    assert "no-such-model" in result.output


def test_generate_has_an_option_for_every_setting_at_the_dataclass_default() -> None:
    """A new `GenerationSettings` field is a new `generate` option, with the field's help, and
    `generate` run with no setting given asks for exactly the dataclass's defaults."""
    params = {p.name: p for p in main.commands["generate"].params}
    for f in fields(GenerationSettings):
        assert f.name in params, f"no --{f.name} option on generate"
        assert params[f.name].opts[0] == option_name(f.name)
        assert f.metadata.get("help") == params[f.name].help
    ctx = main.commands["generate"].make_context("generate", ["--prompt", "x"])
    given = {f.name: ctx.params[f.name] for f in fields(GenerationSettings)}
    assert settings_from_options(given) == GenerationSettings()


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def _click_form(kind: object) -> tuple[str, bool]:
    """(click type name, repeatable) of a setting's Python type."""
    if kind == tuple[str, ...]:
        return "text", True
    names: dict[object, str] = {int: "integer", float: "float", str: "text", bool: "boolean"}
    return names[kind], False


def test_every_setting_option_is_declared_once_by_the_dataclass() -> None:
    """Every command's option named after a setting (generate, demo, edge, bench) has the field's
    help (a command may add a note after it), type, flag and default, but where OWN_FLAGS or
    OWN_DEFAULTS give the command's own: so no command declares a setting a second time,
    differently. The options in NOT_SETTINGS only share a setting's name."""
    settings = {f.name: f for f in fields(GenerationSettings)}
    types = get_type_hints(GenerationSettings)
    seen = set()
    for path, command in _commands(main):
        ctx = click.Context(command)
        for p in command.params:
            if p.name not in settings:
                continue
            key, where = (path, p.name), f"{path} {p.opts[0]}"
            seen.add(key)
            default = p.process_value(ctx, p.get_default(ctx))  # what an untyped option gives
            want = OWN_DEFAULTS.get(key, settings[p.name].default)
            assert default == want, f"{where}: default {default!r} != {want!r}"
            if key in NOT_SETTINGS:
                continue
            field_help = settings[p.name].metadata["help"]
            assert p.help == field_help or (p.help or "").startswith(field_help + " "), where
            form = ("integer|auto", False) if settings[p.name].metadata.get("auto") else None
            assert (p.type.name, p.multiple) == (form or _click_form(types[p.name])), where
            assert p.opts[0] == OWN_FLAGS.get(key, option_name(p.name)), where
    assert set(OWN_DEFAULTS) | set(OWN_FLAGS) | set(NOT_SETTINGS) <= seen
    assert ("edge", "gamma") in seen and ("bench overhead", "temperature") in seen


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (["edge", "--server", "x:1", "--gamma", "0"], "'--gamma'", "gamma=0"),
        (["bench", "overhead", "--tokens", "0"], "'--tokens'", "max_new_tokens=0"),
        (["bench", "realsim", "--temperature", "-1"], "'--temperature'", "temperature=-1.0"),
        (["bench", "quality", "--srdv-k", "0"], "'--srdv-k'", "srdv_k=0"),
    ],
)
def test_a_bad_setting_elsewhere_is_the_same_usage_error(args, option, words) -> None:
    """The edge and the benchmarks refuse a setting by the dataclass's own check, as generate
    does, naming the option as the command spells it, before anything runs."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert option in result.output and words in result.output, result.output


@pytest.mark.parametrize(
    ("args", "option", "words"),
    [
        (["--gamma", "0"], "'--gamma'", "gamma=0"),
        (["--top-p", "0"], "'--top-p'", "top_p=0.0"),
        (["--q-bits", "12"], "'--q-bits'", "q_bits=12"),
        (["--stop", ""], "'--stop'", "not a non-empty string"),
        (["--tree-allocation", "flat"], "'--tree-allocation'", "tree_allocation='flat'"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_the_option(args, option, words) -> None:
    """The dataclass's own check, before any model loads (the target here does not exist)."""
    result = CliRunner().invoke(main, ["generate", "--target", "no-such", "--prompt", "x", *args])
    assert result.exit_code == 2, result.output
    assert option in result.output and words in result.output, result.output
