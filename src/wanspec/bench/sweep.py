"""Run an experiment into a folder and turn its finished cells into a table, a CSV and figures.

Layout of an output directory (one folder per experiment):

    OUT/<experiment>/results.jsonl   one line per finished cell (appended; resumable)
    OUT/<experiment>/manifest.json   the current cells' hashes, the configuration, and every run
                                     (command, wall time, cells run/skipped, versions, machine)
    OUT/<experiment>/results.csv     the table, one row per current cell (rewritten)
    OUT/<experiment>/table.md        the same as a Markdown table
    OUT/<experiment>/summary.md      further tables from the same rows (some experiments)
    OUT/<experiment>/<experiment>.png / .svg, and figures.json (the rows they show: a rerun
                                     or a report redraws them only when the rows change)
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from wanspec.bench.config import Config
from wanspec.bench.context import Context
from wanspec.bench.experiment import Experiment, Row
from wanspec.bench.registry import get_experiment
from wanspec.bench.runner import (
    Cell,
    SweepSummary,
    jsonable,
    read_results,
    run_sweep,
    settings_hash,
)
from wanspec.bench.tables import columns, markdown_table

MANIFEST = "manifest.json"
FIGURES_STAMP = "figures.json"  # which rows the figures on disk show
SUMMARY = "summary.md"  # an experiment's further tables, when it has any
PACKAGES = (
    "wanspec",
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "matplotlib",
    "sacrebleu",
    "rouge-score",
    "tqdm",
    "click",
)


def environment() -> dict[str, Any]:
    """Package versions and the machine, recorded with every run."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "python": platform.python_version(),
        "packages": versions,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "WANSPEC_THREADS": os.environ.get("WANSPEC_THREADS"),
    }


def with_loading(cells: list[Cell], config: Config) -> list[Cell]:
    """`cells` with the configuration's non-default loading options in their settings: another
    dtype, kernel set or device computes other logits, so those are other cells than a default
    run's (which keep their hashes)."""
    changes = config.loading_changes()
    if not changes:
        return list(cells)
    return [Cell(c.key, {**c.settings, "loading": changes}) for c in cells]


def run_experiment(
    name: str,
    config: Config,
    out: Path,
    *,
    data_dir: Path | None = None,
    progress: bool = True,
    command: str | None = None,
    reuse: bool = True,
) -> SweepSummary:
    """Run (or resume) `name` under `config` into `out/name`, then write its table and plots.

    `reuse`: the generation cells share one job store (`wanspec.models.replay`), so cells that
    differ only in link or profiles compute each model pass once; results are the same."""
    experiment = get_experiment(name)
    name = experiment.name  # an alias runs into its experiment's folder
    folder = Path(out) / name
    ctx = Context(threads=config.threads, data_dir=data_dir, loading=config.loading())
    if not reuse:
        ctx.reuse = None
    cells = with_loading(experiment.cells(config, ctx), config)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    summary = run_sweep(
        cells,
        folder,
        lambda cell: experiment.run_cell(cell, ctx),
        description=name,
        progress=progress,
    )
    if ctx.reuse is not None:
        summary.reuse = ctx.reuse.counters()
    manifest = _read_manifest(folder) or {"experiment": name, "runs": []}
    manifest.update(config=jsonable(asdict(config)), cells=[c.hash for c in cells])
    manifest["runs"].append(
        {
            "command": command or shlex.join(["wanspec", *sys.argv[1:]]),
            "config": config.name,
            "started": started,
            "wall_s": round(summary.wall_s, 1),
            "cells_run": len(summary.ran),
            "cells_skipped": len(summary.skipped),
            **_passes(summary),
            "environment": environment(),
        }
    )
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    finalize(folder)
    return summary


def _passes(summary: SweepSummary) -> dict[str, int]:
    """The model passes the job store computed and replayed (nothing where none went through
    it: a run without reuse, or an experiment whose cells do not use it)."""
    passes = {k: (summary.reuse or {}).get(k, 0) for k in ("passes_run", "passes_replayed")}
    return passes if any(passes.values()) else {}


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def current_lines(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and the finished lines of its current cells, in cell order."""
    manifest = _read_manifest(folder)
    if manifest is None:
        raise FileNotFoundError(f"{folder} has no {MANIFEST}: run the experiment first")
    done = read_results(folder)
    missing = [h for h in manifest["cells"] if h not in done]
    if missing:
        raise ValueError(f"{folder}: {len(missing)} cells of the last run are not finished")
    return manifest, [done[h] for h in manifest["cells"]]


def finalize(folder: Path) -> tuple[list[Row], list[Path]]:
    """Write results.csv, table.md and the figures of the experiment in `folder`."""
    manifest, lines = current_lines(folder)
    experiment = get_experiment(manifest["experiment"])
    rows = experiment.table(lines)
    for row, line in zip(rows, lines, strict=True):
        row["hash"] = line["hash"]
    _write_csv(folder / "results.csv", rows)
    (folder / "table.md").write_text(markdown_table(rows) + "\n", encoding="utf-8")
    if experiment.summary is not None:
        (folder / SUMMARY).write_text(experiment.summary(rows) + "\n", encoding="utf-8")
    return rows, _figures(experiment, rows, folder)


def _figures(experiment: Experiment, rows: list[Row], folder: Path) -> list[Path]:
    """Draw the figures unless those on disk were drawn from these very rows (drawing is the
    slow part of a resumed run or a report)."""
    stamp_path = folder / FIGURES_STAMP
    stamp = settings_hash({"rows": rows})
    if stamp_path.exists():
        known = json.loads(stamp_path.read_text())
        paths = [folder / name for name in known["figures"]]
        if known["rows"] == stamp and all(p.exists() for p in paths):
            return paths
    paths = experiment.plot(rows, folder)
    stamp_path.write_text(json.dumps({"rows": stamp, "figures": [p.name for p in paths]}) + "\n")
    return paths


def _write_csv(path: Path, rows: list[Row]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns(rows))
        writer.writeheader()
        writer.writerows(rows)
