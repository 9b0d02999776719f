"""Resumable sweeps: an experiment is a list of cells; each finished cell is one JSON line.

A cell's `settings` hold everything its result depends on (method, dataset and a digest of its
prompts, models, profiles, link, generation settings …); their hash names the cell. A sweep skips
every cell whose hash is already in `results.jsonl`, so an interrupted run continues where it
stopped, and changing one setting recomputes exactly the cells whose settings contain it (method
options live only in the cells of their method). Lines are appended; readers take the last line
per hash.

Cells that differ only in link and profiles run one after another (`reuse_order`): they send the
same model jobs, which a job store shared by the sweep then computes once while they are fresh.
Once every cell has run, the lines of the run are put back in cell order (one atomic rewrite; a
sweep stopped before that leaves them in run order, which readers accept as well).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from wanspec.bench.datasets import jsonl_lines

RESULTS = "results.jsonl"
# what a cell's settings may vary while its model jobs stay the same: timing only
TIMING_SETTINGS = ("link", "edge_profile", "cloud_profile")


def jsonable(value: Any) -> Any:
    """Plain JSON values: numpy scalars become numbers, non-finite floats become null."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(value: Any) -> str:
    """Canonical JSON (sorted keys, no NaN): equal settings give equal text, hence equal hashes."""
    return json.dumps(jsonable(value), sort_keys=True, ensure_ascii=False, allow_nan=False)


def settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(dumps(settings).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    """One point of a sweep: `key` says what it is, `settings` everything that determines it."""

    key: str
    settings: dict[str, Any]

    @property
    def hash(self) -> str:
        return settings_hash(self.settings)


@dataclass
class SweepSummary:
    ran: list[str]
    skipped: list[str]
    wall_s: float
    reuse: dict[str, int] | None = None  # the job store's counters, where the sweep had one


def read_results(folder: Path) -> dict[str, dict[str, Any]]:
    """Every finished cell in `folder`, by settings hash (the last line of a hash wins)."""
    path = Path(folder) / RESULTS
    lines: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return lines
    for number, text in jsonl_lines(path.read_text(encoding="utf-8")):
        try:
            line = json.loads(text)
        except json.JSONDecodeError:  # cut short by a kill mid-write: that cell runs again
            warnings.warn(f"{path}:{number} is not JSON; ignored", stacklevel=2)
            continue
        lines[line["hash"]] = line
    return lines


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line left unfinished by a kill mid-write (no final newline)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def _append(folder: Path, line: dict[str, Any]) -> str:
    path = Path(folder) / RESULTS
    _drop_torn_tail(path)
    text = dumps(line) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
    return text


def reuse_order(cells: Iterable[Cell]) -> list[Cell]:
    """`cells` with those that differ only in `TIMING_SETTINGS` next to each other: groups in
    order of their first cell, each group's cells in their own order."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = {k: v for k, v in cell.settings.items() if k not in TIMING_SETTINGS}
        groups.setdefault(dumps(rest), []).append(cell)
    return [cell for group in groups.values() for cell in group]


def _in_cell_order(folder: Path, written: list[tuple[int, str]]) -> None:
    """Rewrite the lines a run appended (`written`: cell index, text, in run order) in cell
    order, atomically. Lines another writer added meanwhile leave the file as it is."""
    if [i for i, _ in written] == sorted(i for i, _ in written):
        return
    path = Path(folder) / RESULTS
    text = path.read_text(encoding="utf-8")
    block = "".join(line for _, line in written)
    if not text.endswith(block):
        return
    ordered = "".join(line for _, line in sorted(written))
    temporary = path.with_name(RESULTS + ".tmp")
    temporary.write_text(text[: len(text) - len(block)] + ordered, encoding="utf-8")
    os.replace(temporary, path)


def run_sweep(
    cells: Iterable[Cell],
    folder: Path,
    run_cell: Callable[[Cell], dict[str, Any]],
    *,
    description: str = "cells",
    progress: bool = True,
) -> SweepSummary:
    """Run every cell not yet in `folder/results.jsonl`, appending one line per finished cell
    (cells that differ only in link and profiles one after another, see the module docstring)."""
    cells = list(cells)
    hashes = [c.hash for c in cells]
    if len(set(hashes)) != len(hashes):
        dupes = sorted({c.key for c in cells if hashes.count(c.hash) > 1})
        raise ValueError(f"cells with identical settings: {dupes}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    done = read_results(folder)
    todo = reuse_order(c for c in cells if c.hash not in done)
    index = {c.hash: i for i, c in enumerate(cells)}
    began = time.perf_counter()
    bar = tqdm(
        total=len(cells), initial=len(cells) - len(todo), desc=description, disable=not progress
    )
    ran = []
    written: list[tuple[int, str]] = []
    for cell in todo:
        bar.set_postfix_str(cell.key)
        t0 = time.perf_counter()
        result = run_cell(cell)
        text = _append(
            folder,
            {
                "hash": cell.hash,
                "key": cell.key,
                "settings": cell.settings,
                "result": result,
                "wall_s": round(time.perf_counter() - t0, 3),
                "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
        written.append((index[cell.hash], text))
        ran.append(cell.hash)
        bar.update(1)
    bar.close()
    _in_cell_order(folder, written)
    skipped = [h for h in hashes if h in done]
    return SweepSummary(ran, skipped, time.perf_counter() - began)
