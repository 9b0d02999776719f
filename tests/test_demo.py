"""The main job's code path (`wanspec demo`) on a tiny shared pair: every method agrees at T=0."""

from __future__ import annotations

from wanspec.bench.demo import run_demo
from wanspec.sim import Link


def test_demo_runs_every_method_and_greedy_agrees(tiny_pair_shared) -> None:
    draft, target = tiny_pair_shared
    lines: list[str] = []
    rows = run_demo(
        target=str(target),
        draft=str(draft),
        prompt="hello world",
        max_new_tokens=6,
        link=Link(bandwidth_bps=1e6, rtt_s=0.05),
        edge_profile="cpu-measured",
        cloud_profile="cloud-a100-8b",
        echo=lines.append,
    )
    greedy = [r for r in rows if r["temperature"] == 0]
    assert {r["method"] for r in greedy} == {"ar", "naive", "ul", "xcosd", "xcosd-e", "sd", "cosd"}
    assert len({r["text"] for r in greedy}) == 1
    assert not any(line.rstrip().endswith("NO") for line in lines)
