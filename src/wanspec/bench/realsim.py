"""`wanspec bench realsim`: the same requests over real TCP and on the simulator, side by side.

Checks that the simulator's clock is a real run's clock. A `CloudServer` holds the target and a
`WanProxy` in front of it emulates the link, both on loopback (`cloud_behind_wan`, as
`wanspec demo` starts them); the edge runs each request through them on the wall clock. Then the
simulator replays the same request with the same link, compute priced as this machine measures
each job ("measured"), and the machines' own CPU charged (`charge_protocol_cpu=True`): its
ratio to the real run says how much of the wall clock the simulator accounts for. The same
replay without the CPU charge shows what that charge adds, and the forward-pass seconds of both
runs show whether the models themselves ran slower for real (two models sharing cores).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wanspec.bench.config import REAL_HETERO
from wanspec.bench.demo import session_record

METHODS = ("ar", "xcosd", "xcosd-e", "acespec-x")
PROMPTS = (
    "def fibonacci(n):",
    "Write a short story about a robot who learns to paint.",
    "import numpy as np\n\ndef moving_average(x, k):",
    "Q: A farmer has 17 sheep and buys 5 more. How many sheep does he have?\nA:",
)
DEFAULT_RTT_S = 0.02  # LAN-ish, so that compute, not the link, decides the times
DEFAULT_BANDWIDTH_BPS = 100e6


@dataclass
class MethodTiming:
    """One method over every prompt: seconds summed over the prompts."""

    method: str
    prompts: int = 0
    tokens: int = 0
    real_s: float = 0.0  # wall clock, Start to Finish on the edge
    sim_s: float = 0.0  # virtual, protocol CPU charged
    sim_plain_s: float = 0.0  # virtual, forward passes and link only
    real_forward_s: float = 0.0  # the real run's jobs, edge and server
    sim_forward_s: float = 0.0  # the charged replay's jobs (its "measured" prices)
    sim_cpu_s: dict[str, float] = field(default_factory=lambda: {"edge": 0.0, "cloud": 0.0})
    server_loop_cpu_s: float = 0.0  # the real server's event-loop thread CPU
    same_tokens: int = 0  # prompts whose real and simulated tokens agree

    @property
    def ratio(self) -> float:
        """Simulated over real seconds: 1 when the simulator accounts for the whole run."""
        return self.sim_s / self.real_s if self.real_s > 0 else float("nan")

    @property
    def plain_ratio(self) -> float:
        return self.sim_plain_s / self.real_s if self.real_s > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "plain_ratio": self.plain_ratio}


@dataclass
class RealSimReport:
    rows: list[MethodTiming]
    link: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    settings: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "link": self.link,
            "load_before": list(self.load_before),
            "load_after": list(self.load_after),
            "settings": self.settings,
            "methods": [row.to_json() for row in self.rows],
        }


def measure(
    pair: Any,
    *,
    methods: Sequence[str] = METHODS,
    prompts: Sequence[str] = PROMPTS[:2],
    max_new_tokens: int = 24,
    link: Any = None,
    temperature: float = 1.0,
    seed: int = 0,
    gamma: int = 4,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
) -> RealSimReport:
    """Each (prompt, method) once over real TCP, then twice on the simulator (protocol CPU
    charged, and not), one after the other so that the three see the same machine load.
    Prompt i runs seed + i."""
    import wanspec
    from wanspec.net.background import cloud_behind_wan
    from wanspec.net.shaping import link_specs
    from wanspec.sim import Link

    link = link or Link(bandwidth_bps=DEFAULT_BANDWIDTH_BPS, rtt_s=DEFAULT_RTT_S)
    say = progress or (lambda _: None)
    rows = {m: MethodTiming(m) for m in methods}
    settings = {"max_new_tokens": max_new_tokens, "temperature": temperature, "gamma": gamma}
    load_before = os.getloadavg()
    with cloud_behind_wan(pair.target, pair.cloud_info, *link_specs(link)) as (address, server, _):
        sessions = 0
        if warmup:  # first passes allocate and pick kernels: not what is timed
            short = {**settings, "max_new_tokens": 2}
            for method in methods:
                wanspec.generate(pair, prompts[0], method, server=address, **short)
                session_record(server, sessions, timeout_s=30.0)
                sessions += 1
        for i, prompt in enumerate(prompts):
            for method in methods:
                given = {**settings, "seed": seed + i}
                real = wanspec.generate(pair, prompt, method, server=address, **given)
                record = session_record(server, sessions, timeout_s=30.0)
                sessions += 1
                sim = wanspec.generate(
                    pair, prompt, method, link=link, charge_protocol_cpu=True, **given
                )
                plain = wanspec.generate(pair, prompt, method, link=link, **given)
                _add(rows[method], real, record, sim, plain)
                say(
                    f"  prompt {i + 1}/{len(prompts)} {method:<10} real "
                    f"{real.stats['time_s']:.2f} s, simulated {sim.stats['time_s']:.2f} s"
                )
    return RealSimReport(
        list(rows.values()),
        _describe(link),
        load_before,
        os.getloadavg(),
        {**settings, "seed": seed},
    )


def _describe(link: Any) -> str:
    up, down = link.up_bps / 1e6, link.down_bps / 1e6
    rate = f"{up:g} Mbit/s" if up == down else f"{up:g}/{down:g} Mbit/s up/down"
    return f"{rate}, RTT {link.rtt_s * 1e3:g} ms"


def _add(row: MethodTiming, real: Any, record: Any, sim: Any, plain: Any) -> None:
    row.prompts += 1
    row.tokens += len(real.token_ids)
    row.real_s += real.stats["time_s"]
    row.sim_s += sim.stats["time_s"]
    row.sim_plain_s += plain.stats["time_s"]
    row.real_forward_s += sum(real.stats.get("edge_compute_s", {}).values()) + record.forward_s
    row.sim_forward_s += sum(sim.stats["compute_busy_s"].values())
    for side, seconds in sim.stats["protocol_cpu_s"].items():
        row.sim_cpu_s[side] += seconds
    row.server_loop_cpu_s += record.loop_cpu_s
    row.same_tokens += real.token_ids == sim.token_ids


HEADER = (
    "method",
    "real s",
    "sim s",
    "sim/real",
    "no-cpu s",
    "no-cpu/real",
    "fwd real s",
    "fwd sim s",
    "cpu edge s",
    "cpu cloud s",
    "srv loop s",
    "same",
)


def table_lines(report: RealSimReport) -> list[str]:
    """The table: per method, real and simulated seconds (summed over the prompts) and what
    explains the difference."""
    cells = [list(HEADER)]
    for r in report.rows:
        cells.append(
            [
                r.method,
                f"{r.real_s:.2f}",
                f"{r.sim_s:.2f}",
                f"{r.ratio:.3f}",
                f"{r.sim_plain_s:.2f}",
                f"{r.plain_ratio:.3f}",
                f"{r.real_forward_s:.2f}",
                f"{r.sim_forward_s:.2f}",
                f"{r.sim_cpu_s['edge']:.3f}",
                f"{r.sim_cpu_s['cloud']:.3f}",
                f"{r.server_loop_cpu_s:.3f}",
                f"{r.same_tokens}/{r.prompts}",
            ]
        )
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    lines = []
    for row in cells:
        pairs = enumerate(zip(row, widths, strict=True))
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(padded))
    load = "load average {:.2f} {:.2f} {:.2f}"
    return [
        f"link: {report.link}; {report.settings}",
        *lines,
        "",
        "real s: wall clock over TCP (server + WAN proxy + edge here); sim s: the simulator, "
        "measured compute, same link, protocol CPU charged; no-cpu: without that charge; fwd: "
        "forward-pass seconds (real: edge jobs + server jobs); cpu: the protocol CPU the "
        "simulator charged per side; srv loop: the real server's event-loop thread CPU; same: "
        "prompts whose tokens agree",
        f"{load.format(*report.load_before)} before, {load.format(*report.load_after)} after "
        f"({os.cpu_count()} CPUs)",
    ]


def run(
    *,
    target: str = REAL_HETERO[0],
    draft: str = REAL_HETERO[1],
    methods: Sequence[str] | None = None,
    prompts: int = 2,
    rtt_s: float = DEFAULT_RTT_S,
    bandwidth_bps: float = DEFAULT_BANDWIDTH_BPS,
    json_path: Path | None = None,
    echo: Callable[[str], None] = print,
    loading: dict[str, Any] | None = None,
    **options: Any,
) -> RealSimReport:
    """`wanspec bench realsim`: load the pair, measure, print the table, write the JSON."""
    from wanspec.bench.context import Context
    from wanspec.protocols.registry import get_method
    from wanspec.sim import Link

    if not 1 <= prompts <= len(PROMPTS):
        raise ValueError(f"prompts must be 1 to {len(PROMPTS)}, got {prompts}")
    chosen = tuple(get_method(m).name for m in methods or METHODS)  # before minutes of loading
    pair = Context(loading=dict(loading or {})).pair(target, draft)
    link = Link(bandwidth_bps=bandwidth_bps, rtt_s=rtt_s)
    echo(f"{len(chosen)} methods × {prompts} prompts, each over TCP and twice simulated…")
    report = measure(
        pair, methods=chosen, prompts=PROMPTS[:prompts], link=link, progress=echo, **options
    )
    for line in table_lines(report):
        echo(line)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
        echo(f"wrote {json_path}")
    return report


__all__ = ["METHODS", "PROMPTS", "MethodTiming", "RealSimReport", "measure", "run", "table_lines"]
