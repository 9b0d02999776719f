"""Figures of the experiments, drawn with matplotlib's Agg backend into PNG and SVG files.

Where a row carries a measure's 95 % interval (its "<measure> 95% CI" column), the figure draws
it as a vertical line through the point or bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from wanspec.bench.stats import ci_column

Rows = Sequence[dict[str, Any]]


def save(fig: Any, folder: Path, stem: str) -> list[Path]:
    """Write `stem`.png and `stem`.svg; returns both paths."""
    paths = [Path(folder) / f"{stem}.{ext}" for ext in ("png", "svg")]
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return paths


def _distinct(rows: Rows, key: str) -> list[Any]:
    return list(dict.fromkeys(r[key] for r in rows))


def interval_bars(ax: Any, xs: Sequence[Any], intervals: Sequence[Any], color: Any) -> None:
    """Each (lo, hi) interval as a vertical line at its x; None (no interval) draws nothing.
    A line, not an error bar: a bootstrap interval need not hold its point estimate."""
    points = [(x, ci) for x, ci in zip(xs, intervals, strict=True) if ci is not None]
    if points:
        lows, highs = [ci[0] for _, ci in points], [ci[1] for _, ci in points]
        ax.vlines([x for x, _ in points], lows, highs, colors=color, linewidth=1.5, alpha=0.7)


def grouped_bars(
    rows: Rows, *, panels: Sequence[tuple[str, str]], group: str, series: str, ylabel: str
) -> Any:
    """One panel per (column, title); bars of `column` per `group` (x) and `series` (colour)."""
    groups, names = _distinct(rows, group), _distinct(rows, series)
    cols = 2 if len(panels) > 1 else 1
    fig, axes = plt.subplots(
        (len(panels) + cols - 1) // cols,
        cols,
        figsize=(6 * cols, 3.4 * ((len(panels) + 1) // cols)),
        squeeze=False,
    )
    width = 0.8 / max(len(names), 1)
    for ax, (column, title) in zip(axes.flat, panels, strict=False):
        for j, name in enumerate(names):
            values = {r[group]: r[column] for r in rows if r[series] == name}
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(groups))]
            ys = [values.get(g) or 0 for g in groups]
            ax.bar(xs, ys, width=width, label=str(name))
            cis = {r[group]: r.get(ci_column(column)) for r in rows if r[series] == name}
            interval_bars(ax, xs, [cis.get(g) for g in groups], "black")
        ax.set_xticks(range(len(groups)), [str(g) for g in groups], rotation=30, ha="right")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
    axes.flat[0].legend(fontsize="small")
    return fig


def _dodge(j: int, n: int, xs: Sequence[float], logx: bool) -> Callable[[float], float]:
    """Where series j of n draws its intervals: beside the point, a little apart from the other
    series' (otherwise intervals at one x hide each other)."""
    step = j - (n - 1) / 2
    if logx:
        factor = 10 ** (0.012 * step)
        return lambda x: x * factor
    span = (max(xs) - min(xs)) if xs else 0.0
    return lambda x: x + 0.006 * step * (span or 1.0)


def lines_vs(
    rows: Rows,
    *,
    x: str,
    panels: Sequence[tuple[str, str]],
    series: str,
    facet: str,
    xlabel: str,
    logx: bool = True,
) -> Any:
    """A row of panels per `facet` value; one line per `series` of each panel's column vs `x`."""
    facets = _distinct(rows, facet)
    fig, axes = plt.subplots(
        len(facets), len(panels), figsize=(5.5 * len(panels), 3.6 * len(facets)), squeeze=False
    )
    for i, value in enumerate(facets):
        subset = [r for r in rows if r[facet] == value]
        xs_all = [float(r[x]) for r in subset]
        names = _distinct(subset, series)
        for ax, (column, title) in zip(axes[i], panels, strict=True):
            for j, name in enumerate(names):
                points = sorted(
                    (
                        (r[x], r[column], r.get(ci_column(column)))
                        for r in subset
                        if r[series] == name
                    ),
                    key=lambda p: p[0],
                )
                points = [p for p in points if p[1] is not None]
                xs = [a for a, _, _ in points]
                (line,) = ax.plot(xs, [b for _, b, _ in points], marker="o", label=str(name))
                shift = _dodge(j, len(names), xs_all, logx)
                interval_bars(
                    ax, [shift(a) for a in xs], [ci for _, _, ci in points], line.get_color()
                )
            if logx:
                ax.set_xscale("log")
            ax.set_title(f"{title} ({value})")
            ax.set_xlabel(xlabel)
        axes[i][0].legend(fontsize="small")
    return fig


def intervals(
    rows: Rows, *, facet: str, label: str, value: str, lo: str, hi: str, ylabel: str
) -> Any:
    """Per facet, each row's value with its interval as an error bar."""
    facets = _distinct(rows, facet)
    fig, axes = plt.subplots(1, len(facets), figsize=(5 * len(facets), 3.6), squeeze=False)
    for ax, name in zip(axes[0], facets, strict=True):
        subset = [r for r in rows if r[facet] == name]
        ys = [r[value] for r in subset]
        err = [[r[value] - r[lo] for r in subset], [r[hi] - r[value] for r in subset]]
        ax.errorbar(range(len(subset)), ys, yerr=err, fmt="o", capsize=3)
        ax.set_xticks(range(len(subset)), [str(r[label]) for r in subset], rotation=30, ha="right")
        ax.set_title(str(name))
        ax.set_ylabel(ylabel)
    return fig


def analysis_figure(rows: Rows, expected_length: Callable[[float, int], float]) -> Any:
    """E[L] and the cycle time against α: formula curves, simulator markers, one colour per γ."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    alphas = [i / 100 for i in range(0, 100)]
    for gamma in _distinct(rows, "gamma"):
        subset = sorted((r for r in rows if r["gamma"] == gamma), key=lambda r: r["alpha"])
        curve = [expected_length(a, gamma) for a in alphas]
        color = left.plot(alphas, curve, label=f"γ={gamma} formula")[0].get_color()
        xs = [r["alpha"] for r in subset]
        left.plot(xs, [r["E[L] sim"] for r in subset], "o", color=color, label=f"γ={gamma} sim")
        right.plot(
            xs, [r["cycle ms formula"] for r in subset], color=color, label=f"γ={gamma} formula"
        )
        right.plot(
            xs, [r["cycle ms sim"] for r in subset], "o", color=color, label=f"γ={gamma} sim"
        )
    left.set(xlabel="acceptance rate α", ylabel="E[L] = (1−α^γ)/(1−α)", title="accepted length")
    right.set(
        xlabel="acceptance rate α",
        ylabel="ms per round",
        title="stop-and-wait cycle T_draft(γ) + RTT + T_verify",
        ylim=(0, None),
    )
    left.legend(fontsize="small")
    right.legend(fontsize="small")
    return fig
