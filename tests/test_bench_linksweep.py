"""The link sweep (wanspec.bench.linksweep): it runs end to end in the tiny configuration; its
rows, best fixed γ and ratios are the cells' own numbers, recomputed here from the raw lines;
the goals are judged at their thresholds; a pipeline's tokens do not depend on γ."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from wanspec.bench import linksweep
from wanspec.bench.config import CONFIGS
from wanspec.bench.context import Context
from wanspec.bench.runner import settings_hash
from wanspec.bench.stats import ci_column
from wanspec.bench.sweep import current_lines
from wanspec.cli import main
from wanspec.protocols.methods import METHODS

TINY = CONFIGS["tiny"]
SETUP = linksweep.SETUPS["tiny"]
NAME = linksweep.NAME
D = linksweep.DEFAULT_GAMMA


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The experiment once through the command line (tiny): its folder and printed output."""
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        args = ["bench", NAME, "--config", "tiny", "--out", str(out), "--no-progress"]
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out / NAME, result.output


def _rate(line: dict) -> float:
    stats = [p["stats"] for p in line["result"]["prompts"]]
    return sum(s["new_tokens"] for s in stats) / sum(s["time_s"] for s in stats)


def _where(line: dict) -> tuple[float, float, float]:
    s = line["settings"]
    return s["synthetic"]["alpha"], s["link"]["rtt_s"], s["link"]["downlink_bps"]


def test_the_sweep_runs_every_cell_and_draws_both_figures(tiny_run) -> None:
    folder, output = tiny_run
    manifest = json.loads((folder / "manifest.json").read_text())
    _, lines = current_lines(folder)
    assert all(line["hash"] == settings_hash(line["settings"]) for line in lines)
    points = SETUP.points()  # 50 ms at 100 Mbit/s sits in both sweeps: one cell, not two
    assert len(points) == len(set(points)) == 4
    per_point = len(linksweep.BASELINES) + len(linksweep.PIPELINES) * (len(SETUP.gammas) + 1)
    assert len(manifest["cells"]) == len(SETUP.alphas) * len(points) * per_point
    gammas = {
        (line["settings"]["method"], line["settings"]["generation"].get("gamma")) for line in lines
    }
    assert (
        ("deepspec", "auto") in gammas and ("acespec", "auto") in gammas and ("ar", None) in gammas
    )
    for line in lines:  # AceSpec's testbed, and the tree budget reaches deepspec too: B_max in
        s = line["settings"]  # the fixed cells, the edge's own choice in the auto cells
        assert (s["edge_profile"], s["cloud_profile"]) == ("edge-orin", "cloud-a100x4-70b")
        if s["method"] in linksweep.PIPELINES:
            auto = s["generation"]["gamma"] == "auto"
            assert s["generation"]["tree_budget"] == ("auto" if auto else SETUP.tree_budget)
    for stem in (f"{NAME}-rtt", f"{NAME}-rate"):
        assert (folder / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (folder / f"{stem}.svg").read_text()[:2000]
    summary = (folder / "summary.md").read_text()
    for alpha in SETUP.alphas:
        assert f"### Goals (synthetic α={alpha:g})" in summary
        assert f"Verdict (synthetic α={alpha:g}): (a) " in summary
    assert summary in output  # printed under the table


def test_rows_and_best_fixed_gamma_are_the_cells_own_numbers(tiny_run) -> None:
    """Recomputed from the raw lines: each row's tokens/s, each auto row's best fixed γ (the
    fastest fixed γ of its method at its point), and the ratios against it, γ = 4 and acespec."""
    folder, _ = tiny_run
    _, lines = current_lines(folder)
    rows = linksweep._table(lines)
    rate = {
        (*_where(x), x["settings"]["method"], x["settings"]["generation"].get("gamma")): _rate(x)
        for x in lines
    }
    autos = 0
    for line, row in zip(lines, rows, strict=True):
        alpha, rtt, bps = _where(line)
        method, gamma = row["method"], row["γ"]
        assert row["tokens/s"] == pytest.approx(_rate(line))
        assert row["vs acespec γ=4"] == pytest.approx(
            _rate(line) / rate[alpha, rtt, bps, "acespec", D]
        )
        if gamma != "auto":
            assert "best fixed γ" not in row
            continue
        autos += 1
        fixed = {g: rate[alpha, rtt, bps, method, g] for g in SETUP.gammas}
        best = max(fixed, key=lambda g: (fixed[g], -g))
        assert row["best fixed γ"] == best
        assert row["vs best fixed"] == pytest.approx(_rate(line) / fixed[best])
        assert row["vs γ=4"] == pytest.approx(_rate(line) / fixed[D])
        interval = row[ci_column("vs best fixed")]
        assert interval is not None and interval[0] <= interval[1]
    assert autos == len(SETUP.alphas) * len(SETUP.points()) * len(linksweep.PIPELINES)


def test_a_pipelines_tokens_do_not_depend_on_gamma(tiny_run) -> None:
    """The sweep compares times only: at each point every γ, auto included, emits the same text
    (but deepspec-tree's, whose chains carry p̃ or not as the clock says)."""
    folder, _ = tiny_run
    _, lines = current_lines(folder)
    texts: dict[tuple, set] = {}
    for line in lines:
        method = line["settings"]["method"]
        if method in linksweep.PIPELINES and not METHODS[method].tokens_follow_timing:
            key = (*_where(line), line["settings"]["method"])
            texts.setdefault(key, set()).add(tuple(p["text"] for p in line["result"]["prompts"]))
    assert texts and all(len(found) == 1 for found in texts.values())


# ============================================================================ made-up cells


def _line(method: str, gamma, tokens: list[int], seconds: list[float], *, rtt: float = 0.3) -> dict:
    """A finished cell of made-up prompts (one per entry of `tokens`), each round accepting 1."""
    stats = [
        {
            "new_tokens": n,
            "time_s": t,
            "ttft_s": 0.1,
            "decode_tokens": n - 1,
            "decode_time_s": t - 0.1,
            "uplink_bits": 0,
            "downlink_bits": 0,
            "bits_by_type": {},
            "accepted_per_round": [1] * (n // 3),
            "fanout_per_round": [[0] * (gamma if isinstance(gamma, int) else 3)] * (n // 3),
        }
        for n, t in zip(tokens, seconds, strict=True)
    ]
    generation = {"gamma": gamma} if gamma is not None else {}
    return {
        "settings": {
            "method": method,
            "synthetic": {"alpha": 0.8, "seed": 0},
            "target": "t",
            "draft": "d",
            "dataset": {"name": "mini-math"},
            "edge_profile": "edge-orin",
            "cloud_profile": "cloud-a100x4-70b",
            "link": {"uplink_bps": 1e8, "downlink_bps": 1e8, "rtt_s": rtt},
            "generation": generation | {"temperature": 1.0},
        },
        "result": {
            "prompts": [{"id": str(i), "text": "", "stats": s} for i, s in enumerate(stats)]
        },
    }


def test_the_best_fixed_gamma_is_the_fastest_not_the_default_nor_auto() -> None:
    seconds = {1: 4.0, 2: 3.0, 3: 2.0, 4: 2.5, 5: 2.2}  # 60 tokens each: γ = 3 is the fastest
    lines = [_line("acespec", g, [30, 30], [s / 2, s / 2]) for g, s in seconds.items()]
    lines.append(_line("acespec", "auto", [30, 30], [0.9, 1.2]))  # a little slower than γ = 3
    auto = linksweep._table(lines)[-1]
    assert auto["best fixed γ"] == 3
    assert auto["vs best fixed"] == pytest.approx(2.0 / 2.1)
    assert auto["vs γ=4"] == pytest.approx(2.5 / 2.1)
    # paired over the two prompts: 30/0.9 over 30/1 and 30/1.2 over 30/1
    assert auto[ci_column("vs best fixed")] == pytest.approx((1 / 1.2, 1 / 0.9))
    assert auto["mean γ"] == 3 and lines[0]["settings"]["generation"]["gamma"] == 1


def _row(method: str, gamma, rtt_ms: float, bps: float, **ratios: float) -> dict:
    row = {"pair": "p", "method": method, "γ": gamma, "RTT ms": rtt_ms, "rate bps": bps}
    columns = {"ace": "vs acespec γ=4", "best": "vs best fixed", "default": "vs γ=4"}
    for short, value in ratios.items():
        row |= {columns[short]: value, ci_column(columns[short]): None}
    if gamma == "auto":
        row["best fixed γ"] = 6
    return row


def _goal_rows(deep_300: float, deep_10: float, auto_best: float, auto_end: float) -> list[dict]:
    """deepspec at γ = 4 and both autos at the tiny sweep's four points; the 50 ms, 50 kbit/s
    point's auto is `auto_end` over γ = 4, every other extreme 1.2."""
    points = [(10.0, 1e8), (300.0, 1e8), (50.0, 5e4), (50.0, 1e8)]
    deep = {10.0: deep_10, 300.0: deep_300}
    rows = []
    for rtt, bps in points:
        rows.append(_row("deepspec-tree", D, rtt, bps, ace=deep.get(rtt, 1.0)))
        for method in linksweep.PIPELINES:
            end = auto_end if bps == 5e4 else 1.2
            rows.append(_row(method, "auto", rtt, bps, best=auto_best, default=end))
    return rows


def test_goals_are_judged_at_their_thresholds() -> None:
    met = linksweep.goals(_goal_rows(1.3, 1.0, 0.95, 1.15))
    assert len(met) == 8 and all(g.met for g in met), [str(g) for g in met]
    assert linksweep.verdict(met) == {"a": True, "b": True}
    text = [str(g) for g in met]
    assert text[0] == (
        "- (a) deepspec-tree ≥ 1.3× acespec at RTT ≥ 150 ms (γ = 4): **met** — "
        "RTT 300 ms, 100 Mbit/s: 1.300×"
    )
    assert "lowest at RTT 10 ms, 100 Mbit/s: 1.000×" in text[1]
    assert "(best fixed γ = 6)" in text[2]
    assert "RTT 10 ms, 100 Mbit/s: 1.200×; RTT 300 ms" in text[3] and "50 kbit/s: 1.150×" in text[3]

    def failing(**changes: float) -> set[str]:
        found = linksweep.goals(_goal_rows(**({"deep_300": 1.3, "deep_10": 1.0} | changes)))
        return {g.text for g in found if not g.met}

    base = {"auto_best": 0.95, "auto_end": 1.15}
    goal_a = "deepspec-tree ≥ 1.3× acespec at RTT ≥ 150 ms (γ = 4)"
    assert failing(deep_300=1.29, **base) == {goal_a}
    assert failing(deep_10=0.99, **base) == {"deepspec-tree never below acespec (γ = 4)"}
    assert failing(auto_best=0.949, auto_end=1.15) == {
        f"{m} auto within 5 % of the best fixed γ at every point" for m in linksweep.PIPELINES
    }
    assert failing(auto_best=0.95, auto_end=1.149) == {
        f"{m} auto ≥ 1.15× γ = 4 at the sweeps' extremes" for m in linksweep.PIPELINES
    }
    # a point whose ratio is missing fails its goal instead of being skipped
    rows = _goal_rows(1.3, 1.0, 0.95, 1.15)
    rows[0]["vs acespec γ=4"] = None
    assert not linksweep.goals(rows)[1].met
    assert linksweep.verdict(linksweep.goals(rows)) == {"a": False, "b": True}


def test_cells_and_setups() -> None:
    assert set(linksweep.SETUPS) == set(CONFIGS)
    cells = linksweep._cells(TINY, Context())
    assert len({c.hash for c in cells}) == len(cells)
    assert all(c.settings["dataset"]["n"] == SETUP.prompts for c in cells)
    given = linksweep.setup_of(TINY.with_overrides(prompts=1, max_new_tokens=5))
    assert given == replace(SETUP, prompts=1, max_new_tokens=5)
    assert linksweep.SETUPS["moderate"].points() == [
        (0.01, 1e8),
        (0.05, 1e8),
        (0.15, 1e8),
        (0.3, 1e8),
        (0.05, 5e4),
        (0.05, 1e6),
        (0.05, 1e7),
    ]
