"""`wanspec bench realsim` on the tiny heterogeneous pair: a real server, a WAN proxy and the
edge on loopback, the simulator beside them. Timing ratios are the benchmark's business; here
only the table's shape and that both clocks ran."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from wanspec.bench.realsim import HEADER, METHODS, run
from wanspec.cli import main


def _cells(line: str) -> list[str]:
    return line.split()


def test_realsim_times_every_method_for_real_and_simulated(
    tiny_pair_hetero, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANSPEC_THREADS", "1")  # two models share two cores: no thread fights
    draft, target = tiny_pair_hetero
    lines: list[str] = []
    report = run(
        target=str(target),
        draft=str(draft),
        prompts=2,
        max_new_tokens=6,
        rtt_s=0.01,
        echo=lines.append,
    )
    assert [r.method for r in report.rows] == list(METHODS)
    for r in report.rows:
        assert r.prompts == 2 and r.tokens == 12
        assert r.real_s > 0 and r.sim_s > 0 and r.sim_plain_s > 0
        assert r.sim_cpu_s["edge"] > 0 and r.sim_cpu_s["cloud"] > 0
        assert r.real_forward_s > 0 and r.sim_forward_s > 0 and r.server_loop_cpu_s > 0
    header = next(i for i, line in enumerate(lines) if line.startswith("method"))
    assert lines[header].split("  ")[0].strip() == "method"
    rows = lines[header + 1 : header + 1 + len(METHODS)]
    assert [_cells(line)[0] for line in rows] == list(METHODS)
    for line, row in zip(rows, report.rows, strict=True):
        cells = _cells(line)
        assert len(cells) == len(HEADER)
        assert float(cells[1]) > 0 and float(cells[2]) > 0  # real and simulated seconds
        assert float(cells[3]) == pytest.approx(row.ratio, abs=1e-3)
    assert any(line.startswith("load average") for line in lines)
    assert sum(line.startswith("  prompt ") for line in lines) == 2 * len(METHODS)


def test_the_realsim_command(tiny_pair_hetero, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANSPEC_THREADS", "1")
    draft, target = tiny_pair_hetero
    out = tmp_path / "realsim.json"
    args = ["bench", "realsim", "--target", str(target), "--draft", str(draft)]
    args += ["--methods", "ar,xcosd", "--prompts", "1", "--tokens", "4", "--rtt", "0.01"]
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "sim/real" in result.output
    saved = json.loads(out.read_text())
    assert [m["method"] for m in saved["methods"]] == ["ar", "xcosd"]
    assert all(m["real_s"] > 0 and m["sim_s"] > 0 and m["ratio"] > 0 for m in saved["methods"])
    bad = CliRunner().invoke(main, [*args[:6], "--methods", "nope", "--prompts", "1"])
    assert bad.exit_code != 0 and "nope" in bad.output
