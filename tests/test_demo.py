"""The main job's code path (`wanspec demo`) on a tiny shared pair: a real server, a WAN proxy
and the edge on loopback; every method agrees with AR at T=0, over TCP and in the projection."""

from __future__ import annotations

import pytest

from wanspec.bench.demo import run_demo
from wanspec.sim import Link


def test_demo_runs_every_method_over_tcp_and_greedy_agrees(
    tiny_pair_shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANSPEC_THREADS", "1")  # two models share two cores: no thread fights
    draft, target = tiny_pair_shared
    lines: list[str] = []
    link = Link(bandwidth_bps=1e6, rtt_s=0.04)
    rows = run_demo(
        target=str(target),
        draft=str(draft),
        prompt="hello world",
        max_new_tokens=6,
        link=link,
        edge_profile="edge-orin",
        cloud_profile="cloud-a100-32b",
        echo=lines.append,
    )
    assert [r["method"] for r in rows] == ["ar", "naive", "xcosd", "xcosd-e", "sd"]
    assert len({r["text"] for r in rows}) == 1 and all(r["same_as_ar"] for r in rows)
    assert all(r["real"]["clock"] == "wall" and r["real"]["new_tokens"] == 6 for r in rows)
    for r in rows:  # each real run went through the server, one session each
        assert r["cloud"].method == r["method"] and r["cloud"].outcome in ("done", "closed by edge")
        assert (r["cloud"].rounds > 0) == (r["method"] != "ar") and r["cloud"].loop_cpu_s > 0
    spec = rows[1]["real"]
    assert spec["rounds"] >= 2 and spec["time_s"] >= spec["rounds"] * link.rtt_s  # paid the RTT
    progress = [line for line in lines if line.startswith("  [")]
    assert [line.split()[:2] for line in progress] == [
        [f"[{i}/5]", m] for i, m in enumerate(["ar", "naive", "xcosd", "xcosd-e", "sd"], 1)
    ]
    assert all("6 tokens in" in line and "same text as ar" in line for line in progress)
    assert lines.index(progress[-1]) < min(
        i for i, line in enumerate(lines) if "SIMULATED" in line
    )  # each method reported as it finished, before the table
    assert any(line.startswith("warm-up:") and "min in all" in line for line in lines)
    assert not any(line.rstrip().endswith("NO") for line in lines)
    assert any("SIMULATED: edge-orin + cloud-a100-32b" in line for line in lines)
    why = lines[-1]
    assert why.startswith("\nWhy.") and "Projected on edge-orin + cloud-a100-32b" in why
    assert why.count("ms per token against") == 2  # here and projected, each with its numbers


def test_the_demo_needs_ar_first_as_its_baseline() -> None:
    with pytest.raises(ValueError, match="list it first"):
        run_demo(target="x", draft="y", prompt="p", max_new_tokens=1, link=None, methods=("sd",))
