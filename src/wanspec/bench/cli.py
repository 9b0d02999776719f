"""`wanspec bench`: one command per experiment, plus `report`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from wanspec.bench.config import CONFIGS, REAL_HETERO
from wanspec.bench.overhead import PAIRS
from wanspec.bench.realsim import METHODS as REALSIM_METHODS
from wanspec.bench.registry import ALIASES, EXPERIMENTS
from wanspec.models.cli import loading_options
from wanspec.settings_cli import settings_options

DEFAULT_OUT = "docs/results"
LOADING_PARAMS = ("dtype", "device")  # from `loading_options`; recorded only when not default
_SEED_PER_PROMPT = "Prompt i runs seed + i."

_out_option = click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Output directory: one folder per experiment.",
)


@click.group()
def bench() -> None:
    """Experiments on the simulator: resumable sweeps into JSONL/CSV, tables and plots."""


@bench.command("list")
def list_experiments() -> None:
    """Every experiment and configuration."""
    width = max(len(name) for name in [*EXPERIMENTS, *ALIASES])
    for e in EXPERIMENTS.values():
        click.echo(f"{e.name:<{width}} {e.title}")
    for alias, name in ALIASES.items():
        click.echo(f"{alias:<{width}} = {name}")
    click.echo(f"\nconfigurations: {', '.join(CONFIGS)}")


def _command_line() -> str:
    """The command as typed, rebuilt from the parsed options (the same under a test runner)."""
    ctx = click.get_current_context()
    words = ctx.command_path.split()
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if getattr(param, "secondary_opts", None):  # an on/off pair: only a change is worth saying
            if value != param.default:
                words.append(param.opts[0] if value else param.secondary_opts[0])
            continue
        if value is None or value is False or not param.opts:
            continue
        if param.name in LOADING_PARAMS and value == param.default:
            continue  # the default dtype and device go without saying
        words += [param.opts[0]] if value is True else [param.opts[0], str(value)]
    words[0] = "wanspec"
    return shlex.join(words)


def _split(value: str | None) -> tuple[str, ...] | None:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else None


def _experiment_command(name: str, command_name: str | None = None) -> click.Command:
    @click.option(
        "--config",
        "config_name",
        type=click.Choice(list(CONFIGS)),
        default="quick",
        show_default=True,
    )
    @_out_option
    @click.option(
        "--datasets", help="Comma-separated dataset names or JSONL paths (all experiments' lists)."
    )
    @click.option("--prompts", type=int, help="Prompts per dataset (the first N).")
    @settings_options(
        only=["max_new_tokens"],
        defaults={"max_new_tokens": None},
        notes={
            "max_new_tokens": "Every experiment's budget per prompt [the configuration's]; tasks "
            "scored by text keep theirs when smaller."
        },
    )
    @click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Shared data folder (default $WANSPEC_DATA or ../shared/data).",
    )
    @settings_options(
        only=["srdv_k", "srdv_m"],
        defaults={"srdv_k": None, "srdv_m": None},
        notes={"srdv_k": "[the configuration's]", "srdv_m": "[the configuration's]"},
    )
    @click.option("--no-progress", is_flag=True, help="No progress bar.")
    @click.option(
        "--reuse/--no-reuse",
        default=True,
        show_default=True,
        help="Compute each model pass once across cells that differ only in link or profiles "
        "(same results; off: every cell computes its own).",
    )
    @loading_options
    def command(
        config_name: str,
        out: Path,
        datasets: str | None,
        prompts: int | None,
        max_new_tokens: int | None,
        data_dir: Path | None,
        no_progress: bool,
        reuse: bool,
        dtype: str,
        invariant: bool | None,
        device: str,
        **options: Any,
    ) -> None:
        from dataclasses import replace

        from wanspec.bench.sweep import run_experiment
        from wanspec.models.cli import USER_ERRORS

        try:
            config = CONFIGS[config_name].with_overrides(
                datasets=_split(datasets),
                prompts=prompts,
                max_new_tokens=max_new_tokens,
                **options,
            )
            config = replace(config, dtype=dtype, invariant=invariant, device=device)
            summary = run_experiment(
                name,
                config,
                out,
                data_dir=data_dir,
                progress=not no_progress,
                command=_command_line(),
                reuse=reuse,
            )
        except USER_ERRORS as err:
            raise click.ClickException(str(err)) from err
        except KeyboardInterrupt:
            raise click.ClickException(
                "interrupted; finished cells are saved: run the same command again to resume"
            ) from None
        click.echo(
            f"{name}: {len(summary.ran)} cells run, {len(summary.skipped)} already done, "
            f"{summary.wall_s:.1f} s; results in {out / name}"
        )
        if summary.reuse is not None and summary.reuse["passes_run"]:
            click.echo(
                f"model passes: {summary.reuse['passes_run']} computed, "
                f"{summary.reuse['passes_replayed']} replayed"
            )
        click.echo((out / name / "table.md").read_text(encoding="utf-8"))
        further = out / name / "summary.md"
        if further.exists():
            click.echo(further.read_text(encoding="utf-8"))

    command.__doc__ = EXPERIMENTS[name].title + "."
    return bench.command(command_name or name)(command)


for _name in EXPERIMENTS:
    _experiment_command(_name)
for _alias, _name in ALIASES.items():
    _experiment_command(_name, _alias)


@bench.command()
@_out_option
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default="docs/RESULTS.md",
    show_default=True,
)
def report(out: Path, output: Path) -> None:
    """Write the results report (every table and plot, commands, settings, versions, machine)."""
    from wanspec.bench.report import write_report

    try:
        path = write_report(out, output, _command_line())
    except (FileNotFoundError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"wrote {path}")


@bench.command()
@click.option(
    "--pair",
    "pair_name",
    type=click.Choice(list(PAIRS)),
    default="hetero",
    show_default=True,
    help="hetero: smollm2-135m → qwen2.5-coder-0.5b; shared: qwen2.5-coder-0.5b → 1.5b.",
)
@click.option("--draft", help="Draft model (registry name or folder) in place of the pair's.")
@click.option("--target", help="Target model (registry name or folder) in place of the pair's.")
@click.option(
    "--methods", metavar="M1,M2,…", help="Methods to time [every lossless one the pair can run]."
)
@click.option("--prompts", type=click.IntRange(min=1), default=4, show_default=True)
@settings_options(
    only=["max_new_tokens", "gamma", "temperature", "tree_budget", "seed"],
    defaults={"max_new_tokens": 64, "tree_budget": None},
    flags={"max_new_tokens": "--tokens"},
    notes={"tree_budget": "[the method's default]", "seed": _SEED_PER_PROMPT},
)
@click.option(
    "--decodes",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Reference: one-token decodes timed (median).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the numbers as JSON.",
)
def overhead(
    pair_name: str,
    draft: str | None,
    target: str | None,
    methods: str | None,
    json_path: Path | None,
    max_new_tokens: int,
    **options: Any,
) -> None:
    """The protocol's own CPU per round, per side and per phase, beside one target decode."""
    from wanspec.bench.overhead import PhaseTableError, run
    from wanspec.models.cli import USER_ERRORS

    try:
        run(
            pair=pair_name,
            draft=draft,
            target=target,
            methods=_split(methods),
            json_path=json_path,
            echo=click.echo,
            tokens=max_new_tokens,
            **options,
        )
    except PhaseTableError:
        raise  # a stale phase table is a bug to fix, with its traceback
    except USER_ERRORS as err:
        raise click.ClickException(str(err)) from err


@bench.command()
@click.option("--target", default=REAL_HETERO[0], show_default=True, help="Target model.")
@click.option("--draft", default=REAL_HETERO[1], show_default=True, help="Draft model.")
@click.option(
    "--methods",
    metavar="M1,M2,…",
    default=",".join(REALSIM_METHODS),
    show_default=True,
    help="Methods to run.",
)
@click.option("--prompts", type=click.IntRange(min=1, max=4), default=2, show_default=True)
@settings_options(
    only=["max_new_tokens"], defaults={"max_new_tokens": 24}, flags={"max_new_tokens": "--tokens"}
)
@click.option("--rtt", "rtt_s", type=float, default=0.02, show_default=True, help="Seconds.")
@click.option(
    "--bandwidth", "bandwidth_bps", type=float, default=100e6, show_default=True, help="Bits/s."
)
@settings_options(only=["gamma", "temperature", "seed"], notes={"seed": _SEED_PER_PROMPT})
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the numbers as JSON.",
)
@loading_options
def realsim(
    methods: str,
    dtype: str,
    invariant: bool | None,
    device: str,
    **options: Any,
) -> None:
    """The same requests over real TCP (server + WAN proxy here) and on the simulator with the
    protocol's CPU charged: real and simulated seconds per method, and their ratio."""
    from wanspec.bench.realsim import run
    from wanspec.models.cli import USER_ERRORS, loading_kwargs

    try:
        run(
            methods=_split(methods),
            loading=loading_kwargs(dtype, invariant, device),
            echo=click.echo,
            **options,
        )
    except USER_ERRORS as err:
        raise click.ClickException(str(err)) from err
