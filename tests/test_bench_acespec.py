"""AceSpec's experiments (wanspec.bench.acespec): each runs end to end in the tiny configuration
and writes well-formed results and plots; the ideal-pipeline bound is the formula; the summary
judges the pipelines' targets; tree settings reach the runs and enter only the tree methods'
cells."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from wanspec.bench import acespec
from wanspec.bench.config import CONFIGS
from wanspec.bench.context import Context
from wanspec.bench.pipelines import TREE_METHODS
from wanspec.bench.registry import EXPERIMENTS
from wanspec.bench.runner import read_results, settings_hash
from wanspec.bench.stats import Interval, ci_column, interval_text
from wanspec.bench.sweep import columns, current_lines
from wanspec.cli import main

TINY = CONFIGS["tiny"]
NAMES = [e.name for e in acespec.ACESPEC_EXPERIMENTS]
COMMANDS = {name: name for name in NAMES} | {"acespec-ablation": "ablation"}  # the alias


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Every AceSpec experiment once through the command line (tiny); its folder and outputs."""
    out = tmp_path_factory.mktemp("bench")
    outputs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        for name in NAMES:
            args = ["bench", COMMANDS[name], "--config", "tiny", "--out", str(out), "--no-progress"]
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output + repr(result.exception)
            outputs[name] = result.output
    return out, outputs


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def _lines(folder: Path) -> list[dict]:
    return list(read_results(folder).values())


@pytest.mark.parametrize("name", NAMES)
def test_experiment_writes_wellformed_results_and_plots(tiny_run, name: str) -> None:
    folder = tiny_run[0] / name
    manifest = json.loads((folder / "manifest.json").read_text())
    lines = [json.loads(t) for t in (folder / "results.jsonl").read_text().splitlines()]
    assert [line["hash"] for line in lines] == manifest["cells"]
    assert all(line["hash"] == settings_hash(line["settings"]) for line in lines)
    assert {line["settings"]["experiment"] for line in lines} == {name}
    rows = _rows(folder)
    assert [r["hash"] for r in rows] == manifest["cells"]
    assert all(float(r["tokens/s"]) > 0 for r in rows)
    assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / f"{name}.png").stat().st_size > 5000
    assert "<svg" in (folder / f"{name}.svg").read_text()[:2000]
    assert manifest["runs"][-1]["command"].startswith(f"wanspec bench {COMMANDS[name]} ")


LINK_INTERVALS = (
    "tokens/s",
    "decode tokens/s",
    "alpha",
    "hit rate",
    "uplink bits/token",
    "downlink bits/token",
)
INTERVAL_COLUMNS = {
    "acespec-table1": ("tokens/s", "decode tokens/s", "alpha", "hit rate", "speedup vs ar"),
    "acespec-bandwidth": LINK_INTERVALS,
    "acespec-ablation": ("hit rate", "tokens/s", "decode tokens/s", "alpha", "downlink bits/token"),
    "acespec-budget": LINK_INTERVALS,
    "acespec-temperature": LINK_INTERVALS,
}


@pytest.mark.parametrize("name", NAMES)
def test_rate_columns_carry_intervals_that_hold_the_point(tiny_run, name: str) -> None:
    """Each rate column is followed by its interval; with 2 prompts the percentile interval
    spans both prompts' rates, so it holds the point wherever the column has one."""
    assert TINY.prompts >= 2
    folder = tiny_run[0] / name
    _, lines = current_lines(folder)
    rows = EXPERIMENTS[name].table(lines)
    order = columns(rows)
    for column in INTERVAL_COLUMNS[name]:
        assert order[order.index(column) + 1] == ci_column(column)
    for row, text_row in zip(rows, _rows(folder), strict=True):
        for column in INTERVAL_COLUMNS[name]:
            point, ci = row[column], row[ci_column(column)]
            assert text_row[ci_column(column)] == interval_text(ci)
            assert (point is None) == (ci is None), (column, row)
            if ci is not None:
                tol = 1e-9 * max(1.0, abs(point))
                assert ci.lo - tol <= point <= ci.hi + tol, (column, point, ci)
    if name == "acespec-table1":  # paired: ar against itself resamples the same prompts
        assert all(r[ci_column("speedup vs ar")] == (1.0, 1.0) for r in rows if r["method"] == "ar")


def test_ablation_alias_runs_the_experiment_and_prints_issue_8s_tables(tiny_run) -> None:
    out, outputs = tiny_run
    assert not (out / "ablation").exists()
    summary = (out / "acespec-ablation" / "summary.md").read_text()
    for heading in (
        "### Tree shapes at one budget (mini-math)",
        "### Pipelines at 100 Mbit/s",
        "### Constrained link",
        "### Pipeline targets",
    ):
        assert heading in summary
    budget = acespec.SETUPS["tiny"].ablation_budget
    assert f"At B = {budget}, " in summary and "tokens/s" in summary
    assert "| tokens/s 95% CI |" in summary  # the pipelines table's intervals
    assert summary.strip() in outputs["acespec-ablation"]
    parts = [r["part"] for r in _rows(out / "acespec-ablation")]
    assert parts == ["pipelines"] * 5 + ["constrained"] + ["Table II"] * 3


# ============================================================================ the bound

EDGE = {"name": "edge-test", "forward_ms": {"1": 30.0}, "tree_ms": {"1": 30.0, "65": 94.0}}
CLOUD = {"name": "cloud-test", "forward_ms": {"1": 90.0, "9": 130.0}}  # 5 positions: 110 ms


def test_ideal_bound_is_the_formula_in_both_regimes() -> None:
    e_l = (1 - 0.5**4) / (1 - 0.5)  # α = 0.5, γ = 4
    # the window RTT + T_verify(γ+1) = 50 + 110 ms beats γ·T_tree(1) = 120 ms
    assert acespec.ideal_bound(0.5, 4, 1, 0.05, EDGE, CLOUD) == pytest.approx(e_l / 0.160)
    # γ·T_tree(33) = 4·62 ms beats the window
    assert acespec.ideal_bound(0.5, 4, 33, 0.05, EDGE, CLOUD) == pytest.approx(e_l / 0.248)


def _stats(accepted: list[int], budgets: list[int], tokens: int, time_s: float) -> dict:
    return {
        "new_tokens": tokens,
        "time_s": time_s,
        "uplink_bits": 0,
        "downlink_bits": 0,
        "bits_by_type": {},
        "accepted_per_round": accepted,
        "ttft_s": 0.2,
        "decode_tokens": tokens - 1,
        "decode_time_s": time_s - 0.2,
        "cache_hits": 1,
        "cache_misses": 1,
        "budget_per_round": budgets,
    }


def _line(accepted: list[int], budgets: list[int], tokens: int, time_s: float) -> dict:
    return _line_of([_stats(accepted, budgets, tokens, time_s)])


def _line_of(prompts: list[dict]) -> dict:
    return {
        "settings": {
            "method": "acespec",
            "dataset": {"name": "d"},
            "edge_profile": EDGE,
            "cloud_profile": CLOUD,
            "link": {"uplink_bps": 1e8, "downlink_bps": 1e8, "rtt_s": 0.05},
            "generation": {"gamma": 4, "tree_budget": 40, "tree_allocation": "geometric"}
            | {"tree_fixed": False, "temperature": 1.0},
        },
        "result": {"prompts": [{"stats": stats} for stats in prompts]},
    }


def test_ablation_row_bound_uses_per_token_alpha_and_the_mean_budget() -> None:
    """Rounds accepting 1 of 4 twice: α = 2 accepted / 4 tested = 0.5 (accepted/drafted would say
    0.25); budgets 32 and 34 give the mean budget 33."""
    (row,) = acespec._ablation_table([_line([1, 1], [32, 34], tokens=4, time_s=1.0)])
    assert row["alpha"] == 0.5
    assert row["E[L]"] == pytest.approx(1.875)
    assert row["mean B"] == 33
    assert row["ideal bound tokens/s"] == pytest.approx(1.875 / 0.248)
    # the bound is a steady state: it is set against the tokens after the first emit (3 in
    # 0.8 s), not the whole run's 4 in 1 s
    assert row["decode tokens/s"] == pytest.approx(3 / 0.8)
    assert row["of bound"] == pytest.approx((3 / 0.8) / (1.875 / 0.248))
    assert row["hit rate"] == 0.5
    assert (row["tokens/round"], row["ms/round"]) == (2.0, 500.0)


def test_intervals_resample_each_prompts_own_sums() -> None:
    """Prompt 1 accepts 1 of 4 twice (α = 2/4) with 1 hit in 2 lookups; prompt 2 accepts all 4
    twice (α = 8/8) with 3 hits in 3. Two prompts: each interval spans exactly the two prompts'
    rates (α per prompt as per_token_acceptance counts it, not accepted/drafted = 2/8)."""
    first = _stats([1, 1], [32, 34], tokens=4, time_s=1.0)
    second = _stats([4, 4], [32, 34], tokens=10, time_s=2.0)
    second |= {"cache_hits": 3, "cache_misses": 0, "decode_tokens": 9, "decode_time_s": 1.5}
    (row,) = acespec._ablation_table([_line_of([first, second])])
    assert row["alpha"] == 10 / 12 and row[ci_column("alpha")] == (0.5, 1.0)
    assert row["hit rate"] == 4 / 5 and row[ci_column("hit rate")] == (0.5, 1.0)
    assert row["tokens/s"] == 14 / 3 and row[ci_column("tokens/s")] == (4.0, 5.0)
    assert row[ci_column("decode tokens/s")] == (3 / 0.8, 6.0)
    # one prompt: nothing to resample, no interval
    (single,) = acespec._ablation_table([_line_of([first])])
    assert single["alpha"] == 0.5 and single[ci_column("alpha")] is None


def _shape(allocation: str, hits: tuple[float, float], rate: tuple[float, float] | None) -> dict:
    return {
        "part": acespec.PART_SHAPES,
        "dataset": "d",
        "allocation": allocation,
        "mean B": 40.0,
        "hit rate": sum(hits) / 2,
        ci_column("hit rate"): Interval(*hits),
        "tokens/s": None if rate is None else sum(rate) / 2,
        ci_column("tokens/s"): None if rate is None else Interval(*rate),
    }


def test_shapes_verdict_says_which_intervals_tell_the_shapes_apart() -> None:
    apart = acespec._ablation_summary(
        [
            _shape("single", (0.1, 0.2), (5.0, 6.0)),
            _shape("uniform", (0.3, 0.5), (5.5, 7.0)),
            _shape("geometric", (0.45, 0.6), (5.8, 6.5)),
        ]
    )
    assert "### Tree shapes at one budget (d)" in apart
    assert apart.count("\n") == 2  # one sentence, no pipelines rows to tabulate
    assert "At B = 40, by hit rate, single < uniform and single < geometric" in apart
    assert "the other pairs overlap): this run tells those apart" in apart
    assert "the tokens/s intervals all overlap (single [5, 6], uniform [5.5, 7]" in apart
    assert "does not tell the shapes apart by tokens/s." in apart
    reversed_order = acespec.shapes_verdict(
        [_shape("geometric", (0.45, 0.6), (9.0, 9.5)), _shape("single", (0.1, 0.2), (5.0, 6.0))]
    )
    assert "single < geometric with disjoint intervals" in reversed_order
    assert "this run tells that pair apart" in reversed_order
    assert "hit rate intervals all overlap" not in reversed_order
    missing = acespec.shapes_verdict(
        [_shape("single", (0.1, 0.2), None), _shape("uniform", (0.1, 0.2), (1.0, 2.0))]
    )
    assert "single has no tokens/s interval (single none, uniform [1, 2])" in missing
    assert "the hit rate intervals all overlap" in missing
    one_prompt = acespec.shapes_verdict(
        [{**_shape(shape, (0.1, 0.2), None), ci_column("hit rate"): None} for shape in "ab"]
    )
    assert one_prompt.startswith("At B = 40, no shape has a hit rate interval")
    assert "cannot say whether the shapes differ by tokens/s." in one_prompt


def test_summary_judges_the_targets_at_their_thresholds() -> None:
    def row(part: str, method: str, rate: float, tps: float, bound: float | None) -> dict:
        return {"part": part, "dataset": "d", "method": method, "bandwidth bps": rate} | {
            "rtt ms": 50.0,
            "tokens/s": tps,
            "TTFT ms": None,
            "decode tokens/s": tps,
            "ideal bound tokens/s": bound,
            "of bound": tps / bound if bound else None,
            "hit rate": None,
            "alpha": None,
            "E[L]": None,
            "tokens/round": None,
            "ms/round": None,
            "mean B": None,
        }

    rows = [
        row("pipelines", "picospec", 1e8, 10.0, 20.0),
        row("pipelines", "acespec", 1e8, 12.0, 13.5),  # 1.2× picospec: met; 0.889 of bound: not
        row("constrained", "acespec", 5e4, 10.8, 13.5),  # 0.9 of 12: met
    ]
    summary = acespec._ablation_summary(rows)
    assert "| acespec ≥ 1.2× picospec | 1.2 | yes |" in summary
    assert "| acespec ≥ 0.9 of the ideal bound | 0.8889 | no |" in summary
    assert "| acespec at 50 kbit/s ≥ 0.9 of 100 Mbit/s | 0.9 | yes |" in summary
    assert "### Pipelines at 100 Mbit/s, RTT 50 ms (d)" in summary


# ============================================================================ the tiny results


def test_table1_speedup_is_against_ar_of_the_same_pair_and_dataset(tiny_run) -> None:
    rows = _rows(tiny_run[0] / "acespec-table1")
    ar = {(r["pair"], r["dataset"]): float(r["tokens/s"]) for r in rows if r["method"] == "ar"}
    for r in rows:
        expected = float(r["tokens/s"]) / ar[(r["pair"], r["dataset"])]
        assert float(r["speedup vs ar"]) == pytest.approx(expected)
    methods = {pair: {r["method"] for r in rows if r["pair"] == pair} for pair, _ in ar}
    shared, hetero = (f"{d} → {t}" for t, d in (acespec.TINY_SHARED_PAIR, acespec.TINY_PAIR))
    assert methods[shared] == set(acespec.TABLE1_METHODS)
    assert methods[hetero] == {"ar", "split", "acespec-x"}


def test_tree_settings_reach_the_runs(tiny_run) -> None:
    """Fixed budgets are used every round; single puts every alternative at depth 0."""
    for line in _lines(tiny_run[0] / "acespec-budget"):
        budget = line["settings"]["generation"]["tree_budget"]
        for prompt in line["result"]["prompts"]:
            assert set(prompt["stats"]["budget_per_round"]) == {budget}
    shapes = {}
    for line in _lines(tiny_run[0] / "acespec-ablation"):
        g = line["settings"]["generation"]
        if g.get("tree_fixed"):
            fanouts = [f for p in line["result"]["prompts"] for f in p["stats"]["fanout_per_round"]]
            assert all(sum(f) == acespec.SETUPS["tiny"].ablation_budget - 1 for f in fanouts)
            shapes[g["tree_allocation"]] = fanouts
    assert all(f[1:] == [0] * (len(f) - 1) for f in shapes["single"])
    assert any(f[1] > 0 for f in shapes["uniform"])


def test_the_tree_only_adds_hits(tiny_run) -> None:
    """Draft tokens are keyed by position, so picospec and acespec see the same rounds; every
    picospec hit (a fully accepted chain) is an acespec hit too."""
    rows = _rows(tiny_run[0] / "acespec-temperature")
    for t in {r["T"] for r in rows}:
        pico, ace = (
            next(r for r in rows if r["T"] == t and r["method"] == m)
            for m in ("picospec", "acespec")
        )
        assert ace["alpha"] == pico["alpha"]
        assert float(ace["hit rate"]) >= float(pico["hit rate"])


def test_a_slow_link_slows_every_method(tiny_run) -> None:
    rows = _rows(tiny_run[0] / "acespec-bandwidth")
    for method in acespec.BANDWIDTH_METHODS:
        by_rate = {
            float(r["bandwidth bps"]): float(r["tokens/s"]) for r in rows if r["method"] == method
        }
        assert by_rate[1e4] < by_rate[1e8], method


# ============================================================================ cells


def test_tree_settings_enter_only_the_tree_methods_cells(monkeypatch) -> None:
    ctx = Context()
    before = {c.settings["method"]: c.hash for c in acespec._table1_cells(TINY, ctx)[:7]}
    changed = replace(acespec.SETUPS["tiny"], tree_budget=acespec.SETUPS["tiny"].tree_budget + 1)
    monkeypatch.setitem(acespec.SETUPS, "tiny", changed)
    after = {c.settings["method"]: c.hash for c in acespec._table1_cells(TINY, ctx)[:7]}
    tree_methods = set(TREE_METHODS) & set(acespec.TABLE1_METHODS)
    assert {m for m in before if before[m] != after[m]} == tree_methods


def test_datasets_option_replaces_the_setups_list_and_bad_configs_are_refused() -> None:
    config = TINY.with_overrides(datasets=("mini-code",))
    assert acespec.setup_of(config).datasets == ("mini-code",)
    assert acespec.setup_of(TINY).datasets == ("mini-math",)
    with pytest.raises(ValueError, match="no 'other' setup"):
        acespec.setup_of(replace(TINY, name="other"))


def test_max_new_tokens_option_sets_every_budget_even_one_equal_to_the_configs_own() -> None:
    from wanspec.bench.config import CONFIGS

    quick = CONFIGS["quick"]  # its own cap (32) differs from its AceSpec setup's (48)
    assert acespec.setup_of(quick).max_new_tokens == acespec.SETUPS["quick"].max_new_tokens
    given = quick.with_overrides(max_new_tokens=quick.max_new_tokens)
    assert acespec.setup_of(given).max_new_tokens == quick.max_new_tokens
    longer = TINY.with_overrides(max_new_tokens=48)
    assert (longer.max_new_tokens, acespec.setup_of(longer).max_new_tokens) == (48, 48)
    with pytest.raises(ValueError, match="max-new-tokens"):
        TINY.with_overrides(max_new_tokens=0)
