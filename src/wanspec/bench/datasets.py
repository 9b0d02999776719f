"""Prompt sets: JSONL files in the format of the shared benchmark data, by path or by name.

Every line is a JSON object whose first fields are `id`, `prompt` and `reference` (the gold
output, or null), followed by the source's own fields. A dataset name resolves to a file under
the data directory: `--data-dir`, else `$WANSPEC_DATA`, else `../shared/data` next to the
repository. The `mini-*` sets ship inside the package (a few prompts written for wanspec), so
the tiny and quick configurations and the tests need no data directory at all.

A set's *task* decides how its outputs are scored (see `wanspec.bench.metrics`): translation →
BLEU, summary → ROUGE-2, math → exact match of the final number, mcq → exact match of the
answer letter; code and instruction sets are used for speed and bits only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

BUNDLED = "bundled"  # the `file` of a DatasetInfo shipped in wanspec/bench/data


@dataclass(frozen=True)
class DatasetInfo:
    """Where a named set lives and how it is generated and scored."""

    name: str
    file: str  # relative to the data directory, or a file name in the package for bundled sets
    task: str | None  # "translation", "summary", "math", "mcq", "code", "instruction" or None
    bundled: bool = False


DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in [
        DatasetInfo("gsm8k", "gsm8k/test.jsonl", "math"),
        DatasetInfo("humaneval", "humaneval/HumanEval.jsonl", "code"),
        DatasetInfo("alpaca", "alpaca/seed_tasks.jsonl", "instruction"),
        DatasetInfo("wmt14_de-en", "wmt14_de-en/test.jsonl", "translation"),
        DatasetInfo("xsum", "xsum/test.jsonl", "summary"),
        DatasetInfo("cnn_dailymail", "cnn_dailymail/test.jsonl", "summary"),
        DatasetInfo("mmlu", "mmlu/test.jsonl", "mcq"),
        DatasetInfo("specbench", "specbench/question.jsonl", None),
        DatasetInfo("mini-math", "mini_math.jsonl", "math", bundled=True),
        DatasetInfo("mini-code", "mini_code.jsonl", "code", bundled=True),
        DatasetInfo("mini-translation", "mini_translation.jsonl", "translation", bundled=True),
        DatasetInfo("mini-summary", "mini_summary.jsonl", "summary", bundled=True),
        DatasetInfo("mini-mcq", "mini_mcq.jsonl", "mcq", bundled=True),
    ]
}
ALIASES = {"wmt": "wmt14_de-en", "cnndm": "cnn_dailymail"}


@dataclass(frozen=True)
class PromptSet:
    """The first `n` records of a set, with a digest of their content for cell settings."""

    name: str
    task: str | None
    records: tuple[dict[str, Any], ...]
    source: str

    @property
    def digest(self) -> str:
        """Changes whenever an id, prompt or reference changes: the cells using it recompute."""
        h = hashlib.sha256()
        for r in self.records:
            h.update(json.dumps([r["id"], r["prompt"], r["reference"]]).encode())
        return h.hexdigest()[:16]


def default_data_dir() -> Path:
    """$WANSPEC_DATA, else ../shared/data relative to the repository root."""
    env = os.environ.get("WANSPEC_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return repo.parent / "shared" / "data"


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a JSONL text, numbered from 1. Lines end at "\n" only: a JSON
    string written unescaped may hold U+0085 or U+2028, which `str.splitlines` splits at."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield number, line


def read_jsonl(path: Path | str, text: str | None = None) -> list[dict[str, Any]]:
    """Parse a prompt file, checking the three required fields of every line."""
    text = Path(path).read_text(encoding="utf-8") if text is None else text
    records = []
    for number, line in jsonl_lines(text):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from err
        missing = [
            k
            for k in ("id", "prompt", "reference")
            if not isinstance(record, dict) or k not in record
        ]
        if missing:
            raise ValueError(f"{path}:{number}: missing field(s) {missing}")
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise ValueError(f"{path}:{number}: prompt must be a non-empty string")
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no prompts")
    return records


def _info_from_path(path: Path) -> DatasetInfo:
    """A file inside a folder named like a known set (…/gsm8k/test.jsonl) is named and scored
    like it; any other file is named by its stem and not scored."""
    for part in (path.parent.name, path.stem):
        info = DATASETS.get(ALIASES.get(part, part))
        if info:
            return DatasetInfo(info.name, str(path), info.task)
    return DatasetInfo(path.stem, str(path), None)


def load_prompts(
    name_or_path: str, n: int | None = None, data_dir: Path | None = None
) -> PromptSet:
    """A named set or a JSONL path; `n` keeps the first n records (in file order)."""
    if n is not None and n < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {n}")
    key = ALIASES.get(name_or_path, name_or_path)
    info = DATASETS.get(key)
    if info is not None and info.bundled:
        text = resources.files("wanspec.bench").joinpath("data", info.file).read_text("utf-8")
        records = read_jsonl(f"<bundled {info.file}>", text)
        source = f"bundled: wanspec/bench/data/{info.file}"
    elif info is not None:
        root = data_dir or default_data_dir()
        path = root / info.file
        if not path.is_file():
            bundled = ", ".join(k for k, d in DATASETS.items() if d.bundled)
            raise FileNotFoundError(
                f"dataset {key!r} needs {path}; point --data-dir or $WANSPEC_DATA at the shared "
                f"data folder, or use a bundled set ({bundled})"
            )
        records, source = read_jsonl(path), str(path)
    else:
        path = Path(name_or_path)
        if not path.is_file():
            known = ", ".join(sorted([*DATASETS, *ALIASES]))
            raise FileNotFoundError(f"no dataset {name_or_path!r}: not a file, nor one of {known}")
        info = _info_from_path(path)
        records, source = read_jsonl(path), str(path)
    chosen = tuple(records[:n] if n else records)
    return PromptSet(info.name, info.task, chosen, source)
