"""Latency profiles of a `LanguageModel`: ms per forward of n tokens and per tree of B nodes.

The output is the JSON format of `wanspec.sim.profiles` (`forward_ms` / `tree_ms`, each point a
list of repeated measurements whose median is used), so a bench result is directly a simulator
compute profile and feeds AceSpec's tree budget T_tree(B).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wanspec.models.lm import LanguageModel, uses_swapped_linear
from wanspec.paths import user_profiles_dir

DEFAULT_NS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_TREES = (8, 16, 32, 64)


def random_tree(rng: np.random.Generator, size: int) -> list[int]:
    """Parents of a random tree in topological order (-1 = hangs off the cache)."""
    return [-1] + [int(rng.integers(-1, i)) for i in range(1, size)]


def _time_ms(
    run: Callable[[], object], undo: Callable[[], None], warmup: int, repeats: int
) -> list[float]:
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        run()
        elapsed = (time.perf_counter() - start) * 1000.0
        undo()
        if i >= warmup:
            times.append(round(elapsed, 4))
    return times


def cpu_name() -> str:
    """Human-readable CPU model (Linux /proc/cpuinfo, else platform)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _check_sizes(values: Sequence[int], what: str) -> list[int]:
    sizes = [int(v) for v in values]
    if not sizes or any(v < 1 for v in sizes):
        raise ValueError(f"{what} must be a non-empty list of positive sizes, got {values!r}")
    return sizes


def measure_profile(
    lm: LanguageModel,
    ns: Sequence[int] = DEFAULT_NS,
    tree_sizes: Sequence[int] = DEFAULT_TREES,
    context: int = 64,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Time forwards of n new tokens and trees of B nodes after `context` cached tokens.

    Resets the model's cache. Random token ids are used: latency does not depend on them.
    """
    ns, tree_sizes = _check_sizes(ns, "ns"), _check_sizes(tree_sizes, "tree_sizes")
    if context < 1 or repeats < 1 or warmup < 0:
        raise ValueError("context and repeats must be >= 1 and warmup >= 0")
    rng = np.random.default_rng(seed)
    lm.prefill(rng.integers(0, lm.vocab_size, context).tolist())

    def undo() -> None:
        lm.truncate(context)

    forward = {}
    for n in ns:
        ids = rng.integers(0, lm.vocab_size, n).tolist()
        forward[str(n)] = _time_ms(lambda ids=ids: lm.extend(ids), undo, warmup, repeats)
    tree = {}
    for size in tree_sizes:
        tokens = rng.integers(0, lm.vocab_size, size).tolist()
        parents = random_tree(rng, size)
        tree[str(size)] = _time_ms(
            lambda t=tokens, p=parents: lm.tree_forward(t, p), undo, warmup, repeats
        )
    lm.reset()
    return _metadata(lm, context, repeats) | {"forward_ms": forward, "tree_ms": tree}


def _metadata(lm: LanguageModel, context: int, repeats: int) -> dict[str, Any]:
    import transformers

    threads = torch.get_num_threads()
    dtype = str(getattr(lm, "dtype", "unknown")).removeprefix("torch.")
    model = getattr(lm, "model", None)
    swapped = model is not None and uses_swapped_linear(model)
    return {
        "name": f"{lm.name}-cpu{threads}t",
        "source": f"wanspec bench on {cpu_name()}, {threads} threads, {dtype}, "
        f"context {context}, {repeats} repeats",
        "model": lm.name,
        "dtype": dtype,
        "threads": threads,
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "context": context,
        "repeats": repeats,
        "fast_linear": swapped,
    }


def save_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Write a profile as JSON (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2) + "\n")
    return path


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read a profile written by `save_profile`; raises ValueError if it is not one."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("forward_ms"), dict):
        raise ValueError(f"{path} is not a latency profile (no 'forward_ms' table)")
    return data


def median_ms(profile: dict[str, Any], table: str, size: int) -> float:
    """Median of the repeats at one point of `forward_ms` or `tree_ms`."""
    value = profile[table][str(size)]
    return float(statistics.median(value) if isinstance(value, list) else value)


def format_table(profile: dict[str, Any]) -> str:
    """Median ms per pass, and the ratio to a one-token forward."""
    one = median_ms(profile, "forward_ms", 1) if "1" in profile["forward_ms"] else None
    lines = [
        f"{profile.get('model', '?')}  {profile.get('dtype', '')}  "
        f"{profile.get('threads', '?')} threads  context {profile.get('context', '?')}",
        f"{'pass':<14}{'ms':>10}{'x n=1':>8}",
    ]
    for table, label in (("forward_ms", "forward n="), ("tree_ms", "tree B=")):
        for size in sorted(profile.get(table, {}), key=int):
            ms = median_ms(profile, table, int(size))
            ratio = f"{ms / one:8.2f}" if one else f"{'':>8}"
            lines.append(f"{label + size:<14}{ms:>10.2f}{ratio}")
    return "\n".join(lines)


def default_profile_path(profile: dict[str, Any]) -> Path:
    """$WANSPEC_HOME/profiles/<name>.json, where `wanspec.sim` looks up user profiles by name."""
    return user_profiles_dir() / f"{profile['name']}.json"


def bench_command(
    name_or_path: str,
    out: str | None = None,
    threads: int | None = None,
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    fast_linear: bool = True,
) -> dict[str, Any]:
    """Measure a registry model (or local folder), print the table and write the JSON profile."""
    from wanspec.models.lm import load_model
    from wanspec.models.registry import resolve_model

    lm = load_model(
        resolve_model(name_or_path), dtype=dtype, threads=threads, fast_linear=fast_linear
    )
    profile = measure_profile(lm, repeats=repeats)
    path = save_profile(profile, out if out is not None else default_profile_path(profile))
    print(format_table(profile))
    print(f"wrote {path}")
    return profile
