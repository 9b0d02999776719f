"""The main job's code path (`wanspec demo`) on a tiny shared pair: a real server, a WAN proxy
and the edge on loopback; every method agrees with AR at T=0, over TCP and in the projection."""

from __future__ import annotations

import pytest

from wanspec.bench.demo import run_demo, run_shared_win
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


def test_the_shared_win_runs_ar_and_sd_over_tcp_with_the_same_text(
    tiny_pair_shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's last part: ar, then sd at γ = 3, each through a real server and WAN proxy;
    the speed-up is sd's measured rate over ar's (its value is a benchmark, not a test)."""
    monkeypatch.setenv("WANSPEC_THREADS", "1")
    draft, target = tiny_pair_shared
    lines: list[str] = []
    got = run_shared_win(
        target=str(target), draft=str(draft), prompt="hello", max_new_tokens=6, echo=lines.append
    )
    assert got["same_text"] and got["ar"]["new_tokens"] == got["sd"]["new_tokens"] == 6
    assert got["ar"]["clock"] == got["sd"]["clock"] == "wall"
    sd = got["sd"]  # γ = 3: three draft steps per round
    assert sd["rounds"] >= 2 and sd["edge_computes"]["draft"] == 3 * sd["rounds"]
    assert got["speedup"] == pytest.approx(got["sd"]["tokens_per_s"] / got["ar"]["tokens_per_s"])
    assert lines[0].startswith("\nA real win") and "sd at γ = 3" in lines[0]
    assert [line.split()[0] for line in lines[1:3]] == ["ar", "sd"]
    assert lines[-1].strip().startswith("sd / ar = ") and "same text" in lines[-1]
