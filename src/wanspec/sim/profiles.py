"""Compute profiles: what a `ComputeCost` costs in seconds on a given device.

A `TableProfile` interpolates measured milliseconds per forward pass over the number of new
positions n (piecewise linear between points, linear extrapolation above the last point, flat
below the first), plus an optional per-context-token term; a `MeasuredProfile` charges the real
wall time the computation took. Named profiles ship as JSON in `wanspec/sim/data`.

JSON format (the same as the output of a latency benchmark, so a bench result is a profile):

    {"name": "edge-orin", "source": "where the numbers come from",
     "forward_ms": {"1": 40.0, "4": 40.0, "64": 45.0},   # ms per pass of n new tokens
     "tree_ms": {"1": 40.0, "64": 46.0},                # optional: ms per tree of n nodes
     "context_ms_per_token": 0.0,                        # optional: ms per cached token per pass
     "cpu_ms": 0.0,                                      # optional: ms per "cpu" computation
     "batch_session_ms": 0.0}                            # optional: ms per extra session in a pass

A value may also be a list of repeated measurements (the median is used). Other keys (model,
device, notes, ...) are kept as metadata and ignored.

Batched passes (a cloud serving many edges, `wanspec.sim.many`): one pass over one job from each
of S sessions, n_j new tokens after c_j cached ones, costs

    T(tokens, sessions) = curve(Σ n_j) + context_ms_per_token · Σ c_j + batch_session_ms · (S − 1)

A decode pass is bound by reading the weights, which the curve's value at one token mostly is
and which a batch reads once; every position adds its compute along the curve's slope wherever
it comes from; each further session adds what it alone brings: reading its own KV cache (the
shipped A100 profiles derive `batch_session_ms` from the model's KV bytes per token at a
512-token context and the bandwidth their T(1) implies). With S = 1 this is exactly `seconds`,
so one edge on a shared cloud times as it does alone.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from wanspec.jobs import ComputeCost
from wanspec.paths import user_profiles_dir

_KINDS = ("forward", "tree", "cpu")


class Profile(Protocol):
    """Anything that prices a computation; `wall_s` is the real time `run()` took."""

    name: str
    source: str

    def seconds(self, cost: ComputeCost, wall_s: float | None = None) -> float: ...


def _check_cost(cost: ComputeCost) -> None:
    if not isinstance(cost, ComputeCost):
        raise TypeError(f"expected a ComputeCost, got {type(cost).__name__}")
    if cost.kind not in _KINDS:
        raise ValueError(f"unknown compute kind {cost.kind!r}; expected one of {_KINDS}")
    for name in ("n", "context", "passes"):
        if getattr(cost, name) < 0:
            raise ValueError(f"ComputeCost.{name} must be >= 0, got {getattr(cost, name)}")


@dataclass(frozen=True)
class Curve:
    """Milliseconds as a piecewise-linear function of n through measured points."""

    n: tuple[float, ...]
    ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.n) == 0 or len(self.n) != len(self.ms):
            raise ValueError("a curve needs one ms value per n, and at least one point")
        if any(b <= a for a, b in zip(self.n, self.n[1:], strict=False)):
            raise ValueError(f"curve n values must be strictly increasing, got {self.n}")
        if self.n[0] < 1:
            raise ValueError(f"curve n values must be >= 1, got {self.n}")
        if any(not (m >= 0 and m < float("inf")) for m in self.ms):
            raise ValueError(f"curve ms values must be finite and >= 0, got {self.ms}")

    @classmethod
    def from_mapping(cls, points: Mapping[Any, Any]) -> Curve:
        """From {n: ms} (JSON keys may be strings; a value may be a list of repeats)."""
        if not isinstance(points, Mapping) or not points:
            raise ValueError(f"expected a non-empty mapping of n -> ms, got {points!r}")
        pairs = sorted((_as_n(k), _as_ms(v)) for k, v in points.items())
        return cls(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))

    def __call__(self, n: float) -> float:
        """ms at n: flat below the first point, linear beyond the last along the last segment
        (a one-point curve is constant); never negative."""
        xs, ys = self.n, self.ms
        if n <= xs[0] or len(xs) == 1:
            return ys[0]
        i = min(bisect.bisect_right(xs, n), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (n - x0) / (x1 - x0))

    def to_mapping(self) -> dict[str, float]:
        return {_key(n): m for n, m in zip(self.n, self.ms, strict=True)}


def _key(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else str(n)


def _as_n(key: Any) -> float:
    try:
        n = float(key)
    except (TypeError, ValueError):
        raise ValueError(f"curve key must be a number of tokens, got {key!r}") from None
    return n


def _as_ms(value: Any) -> float:
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError("empty list of measurements")
        return float(statistics.median(float(v) for v in value))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"curve value must be milliseconds (a number), got {value!r}")
    return float(value)


@dataclass(frozen=True)
class TableProfile:
    """Table-driven device profile: a pass of n tokens costs forward(n) ms (tree(n) for a tree
    pass) plus context_ms_per_token per cached token; "cpu" work costs cpu_ms."""

    name: str
    forward: Curve
    tree: Curve | None = None
    context_ms_per_token: float = 0.0
    cpu_ms: float = 0.0
    source: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False)
    batch_session_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.context_ms_per_token >= 0 or not self.cpu_ms >= 0:
            raise ValueError("context_ms_per_token and cpu_ms must be >= 0")
        if not self.batch_session_ms >= 0:
            raise ValueError(f"batch_session_ms must be >= 0, got {self.batch_session_ms!r}")

    def seconds(self, cost: ComputeCost, wall_s: float | None = None) -> float:
        """Virtual duration of `cost`; passes run back to back, each adding n to the context."""
        _check_cost(cost)
        if cost.kind == "cpu":
            return self.cpu_ms / 1000.0
        if cost.n == 0 or cost.passes == 0:
            return 0.0
        curve = self.tree if cost.kind == "tree" and self.tree is not None else self.forward
        p = cost.passes
        context_tokens = p * cost.context + cost.n * p * (p - 1) // 2
        return (p * curve(cost.n) + self.context_ms_per_token * context_tokens) / 1000.0

    def batch_seconds(self, costs: Sequence[ComputeCost]) -> float:
        """One batched pass over one job of each of several sessions (formula in the module
        docstring); a single job costs exactly `seconds(job)`."""
        if len(costs) == 0:
            raise ValueError("a batched pass needs at least one job")
        if len(costs) == 1:
            return self.seconds(costs[0])
        for cost in costs:
            _check_cost(cost)
            if cost.kind != "cpu" and cost.passes > 1:
                raise ValueError(f"a batched pass cannot hold a job of {cost.passes} passes")
        passes = [c for c in costs if c.kind != "cpu" and c.n > 0 and c.passes > 0]
        if not passes:  # bookkeeping only: side by side, as long as the longest
            return max(self.seconds(c) for c in costs)
        trees = self.tree is not None and all(c.kind == "tree" for c in passes)
        curve = self.tree if trees and self.tree is not None else self.forward
        ms = (
            curve(sum(c.n for c in passes))
            + self.context_ms_per_token * sum(c.context for c in passes)
            + self.batch_session_ms * (len(passes) - 1)
        )
        return ms / 1000.0

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **self.metadata,
            "name": self.name,
            "source": self.source,
            "forward_ms": self.forward.to_mapping(),
        }
        if self.tree is not None:
            data["tree_ms"] = self.tree.to_mapping()
        data["context_ms_per_token"] = self.context_ms_per_token
        data["cpu_ms"] = self.cpu_ms
        if self.batch_session_ms:
            data["batch_session_ms"] = self.batch_session_ms
        return data


@dataclass(frozen=True)
class MeasuredProfile:
    """Charges the wall time each `run()` really took (times `scale`, e.g. to emulate a device
    that is `scale`× slower than this machine)."""

    name: str = "measured"
    scale: float = 1.0
    source: str = "wall-clock time of each Compute.run() on this machine"

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale!r}")

    def seconds(self, cost: ComputeCost, wall_s: float | None = None) -> float:
        _check_cost(cost)
        if wall_s is None:
            raise ValueError("a measured profile needs the wall time of the computation")
        return max(0.0, wall_s) * self.scale


_KNOWN_KEYS = (
    "name",
    "source",
    "forward_ms",
    "tree_ms",
    "context_ms_per_token",
    "cpu_ms",
    "batch_session_ms",
)


def profile_from_dict(data: Mapping[str, Any], name: str | None = None) -> TableProfile:
    """Build a profile from the JSON format above (a shipped profile or a bench result)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a profile must be a JSON object, got {type(data).__name__}")
    if "forward_ms" not in data:
        raise ValueError("a profile needs 'forward_ms': {n: milliseconds per pass of n tokens}")
    tree = data.get("tree_ms")
    return TableProfile(
        name=str(name or data.get("name") or "unnamed"),
        forward=Curve.from_mapping(data["forward_ms"]),
        tree=None if tree is None else Curve.from_mapping(tree),
        context_ms_per_token=float(data.get("context_ms_per_token", 0.0)),
        cpu_ms=float(data.get("cpu_ms", 0.0)),
        batch_session_ms=float(data.get("batch_session_ms", 0.0)),
        source=str(data.get("source", "")),
        metadata={k: v for k, v in data.items() if k not in _KNOWN_KEYS},
    )


def batch_seconds(profile: Profile, costs: Sequence[ComputeCost]) -> float:
    """What `profile` charges for one pass batching `costs` (one job per session)."""
    price = getattr(profile, "batch_seconds", None)
    if price is None:
        raise ValueError(
            f"profile {profile.name!r} cannot price a batched pass (it charges what it measures); "
            "give the shared cloud a table profile, e.g. cloud-a100-8b"
        )
    return float(price(costs))


def _user_dir() -> Path:
    return user_profiles_dir()


def _shipped() -> dict[str, Any]:
    folder = resources.files("wanspec.sim").joinpath("data")
    return {p.name[:-5]: p for p in folder.iterdir() if p.name.endswith(".json")}


def available_profiles() -> dict[str, str]:
    """Names usable with `load_profile` → their source (user profiles shadow shipped ones)."""
    found = {"measured": MeasuredProfile().source}
    for name, path in _shipped().items():
        found[name] = str(json.loads(path.read_text()).get("source", ""))
    user = _user_dir()
    if user.is_dir():
        for path in sorted(user.glob("*.json")):
            found[path.stem] = f"{path} (user profile)"
    return found


def load_profile(spec: str | os.PathLike[str] | Mapping[str, Any] | Profile) -> Profile:
    """A profile from a name, a JSON file path, a dict, or a profile (returned as is).

    Names are looked up in $WANSPEC_HOME/profiles/<name>.json first (e.g. a bench result for
    this machine), then among the shipped profiles; "measured" is the wall-clock profile.
    """
    if isinstance(spec, TableProfile | MeasuredProfile):
        return spec
    if isinstance(spec, Mapping):
        return profile_from_dict(spec)
    if not isinstance(spec, str | os.PathLike):
        if hasattr(spec, "seconds"):
            return spec
        raise TypeError(f"cannot make a profile from {type(spec).__name__}")
    text = os.fspath(spec)
    if text == "measured":
        return MeasuredProfile()
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        return _read(path, name=None)
    user = _user_dir() / f"{text}.json"
    if user.is_file():
        return _read(user, name=text)
    shipped = _shipped()
    if text in shipped:
        return profile_from_dict(json.loads(shipped[text].read_text()), name=text)
    known = ", ".join(sorted(available_profiles()))
    raise ValueError(f"unknown profile {text!r}; known: {known} (or give a .json path)")


def _read(path: Path, name: str | None) -> TableProfile:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"profile file {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"profile file {path} is not valid JSON: {err}") from None
    return profile_from_dict(data, name=name or data.get("name") or path.stem)
