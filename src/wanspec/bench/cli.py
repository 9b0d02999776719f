"""`wanspec bench`: one command per experiment, plus `report`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from wanspec.bench.config import CONFIGS
from wanspec.bench.experiments import ALIASES, EXPERIMENTS

DEFAULT_OUT = "docs/results"

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
        if value is None or value is False or not param.opts:
            continue
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
    @click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Shared data folder (default $WANSPEC_DATA or ../shared/data).",
    )
    @click.option("--srdv-k", type=int, help="X-CoSD-E candidates K.")
    @click.option("--srdv-m", type=int, help="X-CoSD-E candidate rounds M.")
    @click.option("--no-progress", is_flag=True, help="No progress bar.")
    def command(
        config_name: str,
        out: Path,
        datasets: str | None,
        prompts: int | None,
        data_dir: Path | None,
        no_progress: bool,
        **options: Any,
    ) -> None:
        from wanspec.bench.sweep import run_experiment
        from wanspec.cli import _user_errors

        try:
            config = CONFIGS[config_name].with_overrides(
                datasets=_split(datasets), prompts=prompts, **options
            )
            summary = run_experiment(
                name,
                config,
                out,
                data_dir=data_dir,
                progress=not no_progress,
                command=_command_line(),
            )
        except _user_errors() as err:
            raise click.ClickException(str(err)) from err
        except KeyboardInterrupt:
            raise click.ClickException(
                "interrupted; finished cells are saved: run the same command again to resume"
            ) from None
        click.echo(
            f"{name}: {len(summary.ran)} cells run, {len(summary.skipped)} already done, "
            f"{summary.wall_s:.1f} s; results in {out / name}"
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
