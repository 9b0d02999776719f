"""Figures of the experiments, drawn with matplotlib's Agg backend into PNG and SVG files."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
        ax.set_xticks(range(len(groups)), [str(g) for g in groups], rotation=30, ha="right")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
    axes.flat[0].legend(fontsize="small")
    return fig


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
        for ax, (column, title) in zip(axes[i], panels, strict=True):
            for name in _distinct(subset, series):
                points = sorted((r[x], r[column]) for r in subset if r[series] == name)
                points = [(a, b) for a, b in points if b is not None]
                ax.plot([a for a, _ in points], [b for _, b in points], marker="o", label=str(name))
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
