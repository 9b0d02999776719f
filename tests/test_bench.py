"""The experiment framework: every experiment end to end (tiny configuration), resumable sweeps,
the paper's bit accounting, and the quality metrics on hand-checked examples."""

from __future__ import annotations

import csv
import json
import math
import re
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from wanspec.bench.accounting import Events, Vocab, paper_bits
from wanspec.bench.config import CONFIGS
from wanspec.bench.context import Context
from wanspec.bench.datasets import DATASETS, load_prompts
from wanspec.bench.experiment import generation_cell, run_generation_cell, synthetic_pair
from wanspec.bench.metrics import (
    METRICS,
    answer_letter,
    bleu,
    final_number,
    gold_answer,
    paired_difference_interval,
    rouge2,
)
from wanspec.bench.registry import EXPERIMENTS
from wanspec.bench.runner import Cell, read_results, run_sweep, settings_hash
from wanspec.bench.stats import ci_column, interval_text
from wanspec.bench.sweep import columns, current_lines, run_experiment
from wanspec.cli import main

TINY = CONFIGS["tiny"]
# the experiments this file covers (others, e.g. AceSpec's, are tested where they are defined)
NAMES = ("xcosd-bits", "xcosd-rate", "quality", "analysis")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    """A private WANSPEC_HOME (the tiny pair is built there once) for the whole module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        yield


@pytest.fixture(scope="module")
def tiny_out(home, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every experiment run once through the command line in the tiny configuration."""
    out = tmp_path_factory.mktemp("bench")
    for name in NAMES:
        args = ["bench", name, "--config", "tiny", "--out", str(out), "--no-progress"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output + repr(result.exception)
    return out


# ============================================================================ end to end


@pytest.mark.parametrize("name", NAMES)
def test_experiment_writes_wellformed_results_and_plots(tiny_out: Path, name: str) -> None:
    folder = tiny_out / name
    manifest = json.loads((folder / "manifest.json").read_text())
    lines = [json.loads(t) for t in (folder / "results.jsonl").read_text().splitlines()]
    assert [line["hash"] for line in lines] == manifest["cells"]
    for line in lines:
        assert line["hash"] == settings_hash(line["settings"])
        assert line["settings"]["experiment"] == name
    with open(folder / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["hash"] for r in rows] == manifest["cells"]
    assert all(rows[0][c] != "" for c in rows[0] if c in ("tokens", "E[L] sim", "score"))
    assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / f"{name}.png").stat().st_size > 5000
    assert "<svg" in (folder / f"{name}.svg").read_text()[:2000]
    assert (folder / "table.md").read_text().count("\n") == len(lines) + 2
    assert manifest["runs"][-1]["command"].startswith(f"wanspec bench {name} --config tiny")


# the rate columns of each table that carry a 95 % interval over prompts (seeds for analysis)
INTERVAL_COLUMNS = {
    "xcosd-bits": (
        "acceptance",
        "uplink wire",
        "uplink paper",
        "downlink wire",
        "downlink paper",
    ),
    "xcosd-rate": ("tokens/s", "speedup vs ar"),
    "analysis": ("E[L] sim", "tokens/round sim"),
}


def assert_intervals(rows: list[dict], csv_rows: list[dict], names: tuple[str, ...]) -> None:
    """Each column in `names` is followed by its interval column; where the column has a value,
    the interval holds it (with 2 prompts the percentile interval spans both prompts' rates,
    and the point lies between them); the CSV holds the interval's table text."""
    order = columns(rows)
    for name in names:
        assert order[order.index(name) + 1] == ci_column(name)
    for row, text_row in zip(rows, csv_rows, strict=True):
        for name in names:
            point, ci = row[name], row[ci_column(name)]
            assert text_row[ci_column(name)] == interval_text(ci)
            if point is None:
                assert ci is None
                continue
            assert ci is not None, (name, row)
            tol = 1e-9 * max(1.0, abs(point))
            assert ci.lo - tol <= point <= ci.hi + tol, (name, point, ci)


@pytest.mark.parametrize("name", sorted(INTERVAL_COLUMNS))
def test_rate_columns_carry_intervals_that_hold_the_point(tiny_out: Path, name: str) -> None:
    assert TINY.prompts >= 2 and TINY.analysis_seeds >= 2  # else no interval to check
    folder = tiny_out / name
    _, lines = current_lines(folder)
    rows = EXPERIMENTS[name].table(lines)
    with open(folder / "results.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert_intervals(rows, csv_rows, INTERVAL_COLUMNS[name])
    assert f"{ci_column(INTERVAL_COLUMNS[name][0])} |" in (folder / "table.md").read_text()
    if name == "xcosd-rate":  # paired: ar against itself resamples the same prompts
        assert all(r[ci_column("speedup vs ar")] == (1.0, 1.0) for r in rows if r["method"] == "ar")
        assert any(r[ci_column("tokens/s")].hi > r[ci_column("tokens/s")].lo for r in rows)


def test_bits_events_agree_with_the_protocol_counters(tiny_out: Path) -> None:
    """The accounting counts rejections from accepted_per_round and reads named counters; a
    renamed or missing counter would silently count zero, so check them against each other."""
    for line in read_results(tiny_out / "xcosd-bits").values():
        method = line["settings"]["method"]
        for prompt in line["result"]["prompts"]:
            stats = prompt["stats"]
            events = Events.from_stats(stats, line["settings"]["generation"]["gamma"])
            assert events.rejections == stats.get("rejections", 0), method
            assert sum(stats["accepted_per_round"]) + events.rounds >= stats["new_tokens"]
            if method == "xcosd":
                regions = stats.get("hr_region_C", 0) + stats.get("hr_region_O", 0)
                assert regions == events.rejections
            if method == "xcosd-e":
                assert events.candidate_rounds >= events.rejections
            if method == "xcosd-auto":
                assert events.hr_rejections == stats.get("rejections_hr", 0)
                by_srdv = stats.get("rejections_srdv", 0)
                assert events.hr_rejections + by_srdv == events.rejections
                assert events.candidate_rounds >= by_srdv


def test_cycle_time_matches_the_stop_and_wait_formula(tiny_out: Path) -> None:
    """Flat profiles and unlimited bandwidth make the simulated cycle exactly γ·T_e + RTT + T_c."""
    with open(tiny_out / "analysis" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows
    for row in rows:
        assert float(row["cycle ms sim"]) == pytest.approx(float(row["cycle ms formula"]), rel=1e-9)
        assert float(row["E[L] sim"]) == pytest.approx(float(row["E[L] formula"]), rel=0.15)


def test_greedy_lossless_methods_reproduce_the_target(tiny_out: Path) -> None:
    """At T = 0 every lossless method writes the target's own text, so its paired interval is
    exactly 0; a quality table pairing the wrong reference would show it."""
    lines = list(read_results(tiny_out / "quality").values())
    rows = EXPERIMENTS["quality"].table(lines)
    assert {r["T"] for r in rows} == {0.0}
    texts = {
        (line["settings"]["dataset"]["name"], line["settings"]["method"]): [
            p["text"] for p in line["result"]["prompts"]
        ]
        for line in lines
    }
    for row in rows:
        if row["lossless"] and row["method"] != "ar":
            assert texts[(row["dataset"], row["method"])] == texts[(row["dataset"], "ar")]
            assert (row["Δ vs ar low"], row["Δ vs ar high"]) == (0.0, 0.0)
            assert row["matches ar"] is True


def test_report_has_every_table_plot_command_and_machine(tiny_out: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["bench", "report", "--out", str(tiny_out), "--output", str(tmp_path / "R.md")]
    )
    assert result.exit_code == 0, result.output
    text = (tmp_path / "R.md").read_text()
    for experiment in (EXPERIMENTS[name] for name in NAMES):
        assert f"## {experiment.title} (`{experiment.name}`)" in text
        table = (tiny_out / experiment.name / "table.md").read_text().strip()
        assert table in text
        assert f"wanspec bench {experiment.name} --config tiny" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert len(links) == len(NAMES)
    assert all((tmp_path / link).resolve().stat().st_size > 0 for link in links)
    assert re.search(r"\d+ CPUs", text) and "sacrebleu" in text and "Do not edit" in text


# ============================================================================ resuming


def _cells(n: int, option: int = 0) -> list[Cell]:
    return [Cell(f"cell {i}", {"i": i, **({"option": option} if i == 0 else {})}) for i in range(n)]


def test_sweep_skips_finished_cells_and_recomputes_changed_ones(tmp_path: Path) -> None:
    calls: list[str] = []

    def run(cell: Cell) -> dict:
        calls.append(cell.key)
        return {"value": cell.settings["i"] * 2}

    first = run_sweep(_cells(4), tmp_path, run, progress=False)
    assert (len(first.ran), len(first.skipped), len(calls)) == (4, 0, 4)
    again = run_sweep(_cells(4), tmp_path, run, progress=False)
    assert (len(again.ran), len(again.skipped), len(calls)) == (0, 4, 4)
    changed = run_sweep(_cells(4, option=1), tmp_path, run, progress=False)
    assert calls[4:] == ["cell 0"] and len(changed.skipped) == 3
    # a kill mid-write leaves a torn last line: it is ignored, then cut, and the cell it
    # belonged to runs again
    path = tmp_path / "results.jsonl"
    path.write_text(path.read_text() + '{"hash": "torn')
    with pytest.warns(UserWarning, match="not JSON"):
        run_sweep(_cells(5), tmp_path, run, progress=False)
    assert calls[5:] == ["cell 4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn line is gone: reading no longer warns
        assert len(read_results(tmp_path)) == 6  # 5 cells + the old settings of cell 0


def test_a_finished_cell_whose_text_holds_a_unicode_line_break_is_not_run_again(
    tmp_path: Path,
) -> None:
    """Results are written unescaped (ensure_ascii=False): a generated text holding U+0085 or
    U+2028 must not split its line when read back, or the cell looks unfinished and runs again."""
    calls: list[str] = []

    def run(cell: Cell) -> dict:
        calls.append(cell.key)
        return {"text": "a\x85b\u2028c\x1cd"}

    run_sweep(_cells(2), tmp_path, run, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = run_sweep(_cells(2), tmp_path, run, progress=False)
    assert len(again.skipped) == 2 and len(calls) == 2
    assert read_results(tmp_path)[settings_hash(_cells(2)[1].settings)]["result"]["text"] == (
        "a\x85b\u2028c\x1cd"
    )


def test_experiment_resume_runs_only_the_cells_a_setting_touches(tiny_out: Path) -> None:
    folder = tiny_out / "xcosd-bits"
    before = len((folder / "results.jsonl").read_text().splitlines())
    again = run_experiment("xcosd-bits", TINY, tiny_out, progress=False)
    assert (len(again.ran), len(again.skipped)) == (0, 8)
    changed = run_experiment("xcosd-bits", TINY.with_overrides(srdv_k=2), tiny_out, progress=False)
    assert len(changed.ran) == 2 and len(changed.skipped) == 6  # xcosd-e's and xcosd-auto's
    lines = (folder / "results.jsonl").read_text().splitlines()
    assert len(lines) == before + 2
    new = [json.loads(line) for line in lines[-2:]]
    assert {n["settings"]["method"] for n in new} == {"xcosd-e", "xcosd-auto"}
    assert all(n["settings"]["generation"]["srdv_k"] == 2 for n in new)


# ============================================================================ paper accounting


def test_paper_accounting_formulas_on_a_hand_counted_case() -> None:
    """|V| = 1000 → 10-bit ids; γ = 2 → 2-bit accept length; 10 rounds, 4 rejections."""
    vocab = Vocab(target=1000, draft=500, common=300)
    events = Events(
        rounds=10, rejections=4, o_tokens=1, hr_rejections=2, candidate_rounds=5, fallbacks=1,
        skipped=6,
    )  # fmt: skip
    options = {"tr_k": 8, "srdv_k": 4}
    expected = {  # uplink, downlink: worked out by hand from the module's formulas
        "naive": (520, 20 + 60 + 64000),
        "ul": (20 * (10 + 8000), 120),
        "gr": (520, 120),
        "tr": (520, 80 + 4 * 8 * 26),
        "uhlm": (200 + 14 * 8000, 120),
        "xcosd": (520, 80 + 4 * 4816 + 10),
        "xcosd-e": (520, 80 + 5 * 4 * 26 + 4816 + 10),
        "xcosd-auto": (520, 80 + 2 * 4816 + 5 * 4 * 26 + 4816 + 10),  # 2 by HR, 2 by SR-DV
    }
    for method, bits in expected.items():
        assert paper_bits(method, events, vocab, 2, options) == bits, method
    with pytest.raises(ValueError, match="no paper accounting"):
        paper_bits("ar", events, vocab, 2, options)
    # with K chosen online the counted candidates (here 13 over the 5 rounds) are charged
    counted = replace(events, candidates=13)
    assert paper_bits("xcosd-e", counted, vocab, 2, options) == (520, 80 + 13 * 26 + 4816 + 10)
    stats = {"accepted_per_round": [2, 0], "srdv_candidate_rounds": 2, "srdv_candidates": 13}
    assert Events.from_stats(stats, gamma=2).candidates == 13


@pytest.mark.parametrize("method", ["naive", "xcosd"])
def test_paper_column_equals_the_formula_when_every_draft_is_rejected(home, method: str) -> None:
    """Synthetic pair with α = 0: every round rejects its first draft and yields one token, so
    per token the paper charges b_n + 16·|V| (naive) or b_n + 16·|C| + 16 (HR; C = V here)."""
    pair = synthetic_pair(0.0, seed=1)
    ctx = Context(pairs={("synthetic", "synthetic"): pair})
    config = replace(TINY, target="synthetic", draft="synthetic", prompts=1)
    cell = generation_cell(
        config, ctx, "xcosd-bits", method, "mini-math", temperature=1.0, max_new_tokens=12
    )
    line = {"hash": cell.hash, "settings": cell.settings, "result": run_generation_cell(cell, ctx)}
    (row,) = EXPERIMENTS["xcosd-bits"].table([line])
    stats = pair.alignment.stats()
    per_rejection = 16 * stats.target_vocab if method == "naive" else 16 * stats.common + 16
    assert row["tokens"] == 12 and row["acceptance"] == 0
    assert row["downlink paper"] == 2 + per_rejection
    assert row["uplink paper"] == 2 * (math.ceil(math.log2(stats.target_vocab)) + 16)
    # the wire column is what the per-round messages carried, without the session's set-up
    by_type = line["result"]["prompts"][0]["stats"]["bits_by_type"]
    assert row["uplink wire"] * 12 == by_type["Draft"]
    assert row["downlink wire"] * 12 == by_type["VerifyResult"]


# ============================================================================ metrics and data


def test_quality_metrics_on_hand_checked_examples() -> None:
    # BLEU: all n-gram precisions are 1 (9/9, 7/7, 5/5, 3/3); 9 hypothesis vs 10 reference
    # words, so the score is the brevity penalty exp(1 − 10/9)
    hyps = ["the cat sat on the mat", "a dog ran"]
    refs = ["the cat sat on the mat", "a dog ran fast"]
    assert bleu(hyps, refs) == pytest.approx(100 * math.exp(1 - 10 / 9), abs=1e-9)
    # ROUGE-2 F1: 3 of 5 bigrams shared (F = 0.6); 2 of 2 vs 2 of 3 (F = 0.8); mean 70
    assert rouge2(hyps, ["the cat lay on the mat", "a dog ran fast"]) == pytest.approx(70.0)
    # exact match: the final number (#### wins over later numbers), the answer letter
    assert final_number("12 * 5 = 60, so 1,234 are left.") == "1234"
    assert final_number("#### 7\nthen 8 more") == "7"
    assert METRICS["math"].score(["so 1,234 are left.", "#### 7\nthen 8"], ["1234", "8"]) == 50.0
    assert answer_letter(" B. The Nile") == "B" and answer_letter("A guess: C") == "A"
    assert METRICS["mcq"].score([" B. The Nile", "The answer is C"], ["B", "D"]) == 50.0
    stats = METRICS["mcq"].stats([" B", "C"], ["B", "D"])
    assert paired_difference_interval(METRICS["mcq"], stats, stats) == (0.0, 0.0)


def test_prompt_sets_load_by_name_or_path_and_fail_clearly(tmp_path: Path) -> None:
    mini = load_prompts("mini-math", 2)
    assert mini.task == "math" and len(mini.records) == 2
    (tmp_path / "gsm8k").mkdir()
    record = {"id": "a", "prompt": "1+1?", "reference": "#### 2", "final_answer": "2"}
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps(record) + "\n")
    named = load_prompts("gsm8k", None, tmp_path)
    unescaped = {**record, "prompt": "one\u2028two\x85"}  # a line break to splitlines only
    raw = json.dumps(unescaped, ensure_ascii=False) + "\n"
    (tmp_path / "raw.jsonl").write_text(raw, encoding="utf-8")
    assert load_prompts(str(tmp_path / "raw.jsonl")).records[0]["prompt"] == "one\u2028two\x85"
    by_path = load_prompts(str(tmp_path / "gsm8k" / "test.jsonl"))
    assert (named.name, named.task) == (by_path.name, by_path.task) == ("gsm8k", "math")
    assert named.digest == by_path.digest != mini.digest
    with pytest.raises(FileNotFoundError, match="WANSPEC_DATA"):
        load_prompts("xsum", 2, tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "prompt": "x"}\n')
    with pytest.raises(ValueError, match="reference"):
        load_prompts(str(tmp_path / "bad.jsonl"))
    result = CliRunner().invoke(
        main, ["bench", "xcosd-bits", "--datasets", "nope", "--config", "tiny"]
    )
    assert result.exit_code != 0 and "no dataset 'nope'" in result.output


@pytest.mark.parametrize("name", [n for n, d in DATASETS.items() if d.task in METRICS])
def test_each_scored_set_gives_its_own_reference_full_marks(name: str) -> None:
    """Scoring every reference as if a model had written it must give 100: catches a gold
    answer read from the wrong field or a parser that misses the sets' own formats."""
    try:
        prompts = load_prompts(name, 20)
    except FileNotFoundError:
        pytest.skip(f"{name}: the shared data folder is not here")
    metric = METRICS[prompts.task]
    golds = [gold_answer(prompts.task, r) for r in prompts.records]
    assert metric.score([r["reference"] for r in prompts.records], golds) == pytest.approx(100.0)


def test_every_configuration_sizes_every_experiment() -> None:
    """`--config NAME` must work for every experiment the report runs (the moderate size once
    had no capacity setup, so `wanspec bench capacity --config moderate` refused)."""
    from wanspec.bench import acespec, capacity, linksweep

    for setups in (acespec.SETUPS, capacity.SETUPS, capacity.REAL_SETUPS, linksweep.SETUPS):
        assert set(setups) == set(CONFIGS)
