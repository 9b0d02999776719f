"""The `wanspec` command: the group, `methods`, and every command attached to it.

Each command lives in the module of its kind (`run`: generate, demo; `network`: wan-proxy, serve;
the `models`, `bench` and `edge` groups in their packages); the option groups several commands
share, the generation settings' among them, are in `options`.
"""

from __future__ import annotations

import json

import click

from wanspec import __version__
from wanspec.cli.network import serve, wan_proxy, wan_proxy_specs
from wanspec.cli.run import demo, generate

__all__ = ["main", "wan_proxy_specs"]


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


def _attach_commands() -> None:
    from wanspec.bench.cli import bench
    from wanspec.edge_service.cli import edge
    from wanspec.models.cli import models

    for command in (generate, demo, wan_proxy, serve, models, bench, edge):
        main.add_command(command)


_attach_commands()
