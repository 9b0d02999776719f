"""Quality metrics per task, with bootstrap intervals over prompts.

translation → corpus BLEU (sacrebleu, 13a tokenisation); summary → ROUGE-2 F1 ×100 averaged over
examples (rouge-score, Porter stemmer: its tokenizer drops punctuation, so CNN/DM's PTB-tokenised
references score like raw text); math → exact match of the final number (after `####` if the
model wrote one, else the last number), ×100; mcq → exact match of the answer letter, ×100.

Every metric is an aggregate of per-example statistics (BLEU: sacrebleu's n-gram count vector,
summed before scoring; the others: one number, averaged), so a bootstrap resample of prompts is
cheap and exactly the corpus metric on the resampled corpus.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

METRIC_OF_TASK = {
    "translation": "BLEU",
    "summary": "ROUGE-2",
    "math": "accuracy",
    "mcq": "accuracy",
}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_LETTER_FIRST = re.compile(r"^\W*([ABCD])\b")
_LETTER_ANY = re.compile(r"\b([ABCD])\b")


def first_line(text: str) -> str:
    """The first non-empty line: models often go on after the translation or summary."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _normal_number(s: str) -> str:
    s = s.replace(",", "").rstrip(".")
    try:
        value = float(s)
    except ValueError:
        return s
    return str(int(value)) if value.is_integer() else repr(value)


def final_number(text: str) -> str | None:
    """The number after the last `####`, else the last number in the text (commas dropped)."""
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    numbers = _NUMBER.findall(tail) or _NUMBER.findall(text)
    return _normal_number(numbers[-1 if "####" not in text else 0]) if numbers else None


def answer_letter(text: str) -> str | None:
    """A leading A–D letter ("B", " (C) ..."), else the first standalone one."""
    match = _LETTER_FIRST.search(text) or _LETTER_ANY.search(text)
    return match.group(1) if match else None


def gold_answer(task: str, record: dict[str, Any]) -> str:
    """What an output is compared with: the reference text, number or letter."""
    ref = record.get("reference") or ""
    if task == "math":
        gold = record.get("final_answer")
        return _normal_number(str(gold)) if gold is not None else (final_number(ref) or "")
    return str(ref).strip()


@cache
def _bleu() -> Any:
    from sacrebleu.metrics import BLEU

    return BLEU()


@cache
def _rouge() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)


@dataclass(frozen=True)
class Metric:
    """Per-example statistics and how a (resampled) corpus of them becomes one score."""

    name: str
    per_example: Callable[[str, str], Sequence[float]]
    aggregate: Callable[[np.ndarray], float]

    def stats(self, outputs: Sequence[str], golds: Sequence[str]) -> np.ndarray:
        if len(outputs) != len(golds):
            raise ValueError(f"{len(outputs)} outputs but {len(golds)} references")
        return np.array([self.per_example(o, g) for o, g in zip(outputs, golds, strict=True)])

    def score(self, outputs: Sequence[str], golds: Sequence[str]) -> float:
        return self.aggregate(self.stats(outputs, golds))


def _bleu_stats(output: str, gold: str) -> list[int]:
    # sacrebleu's own per-sentence sufficient statistics (what corpus_score sums)
    return _bleu()._extract_corpus_statistics([first_line(output)], [[gold]])[0]


def _bleu_aggregate(stats: np.ndarray) -> float:
    return float(_bleu()._compute_score_from_stats([int(x) for x in stats.sum(axis=0)]).score)


def _rouge2(output: str, gold: str) -> list[float]:
    return [100.0 * _rouge().score(gold, first_line(output))["rouge2"].fmeasure]


def _number_match(output: str, gold: str) -> list[float]:
    return [100.0 * (final_number(output) == gold)]


def _letter_match(output: str, gold: str) -> list[float]:
    return [100.0 * (answer_letter(output) == gold)]


def _mean(stats: np.ndarray) -> float:
    return float(stats[:, 0].mean())


METRICS: dict[str, Metric] = {
    "translation": Metric("BLEU", _bleu_stats, _bleu_aggregate),
    "summary": Metric("ROUGE-2", _rouge2, _mean),
    "math": Metric("accuracy", _number_match, _mean),
    "mcq": Metric("accuracy", _letter_match, _mean),
}


def bleu(outputs: Sequence[str], references: Sequence[str]) -> float:
    return METRICS["translation"].score(outputs, references)


def rouge2(outputs: Sequence[str], references: Sequence[str]) -> float:
    return METRICS["summary"].score(outputs, references)


def _resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_interval(
    metric: Metric, stats: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the corpus score over prompts resampled with replacement."""
    scores = [metric.aggregate(stats[idx]) for idx in _resamples(len(stats), n_boot, seed)]
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(scores, [tail, 100 - tail])
    return float(lo), float(hi)


def paired_difference_interval(
    metric: Metric,
    stats: np.ndarray,
    reference_stats: np.ndarray,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of score(method) − score(reference) with the same prompts resampled for both:
    if it holds 0, the method's quality equals the reference's within sampling noise."""
    if len(stats) != len(reference_stats):
        raise ValueError("paired bootstrap needs the same prompts on both sides")
    diffs = [
        metric.aggregate(stats[idx]) - metric.aggregate(reference_stats[idx])
        for idx in _resamples(len(stats), n_boot, seed)
    ]
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return float(lo), float(hi)
