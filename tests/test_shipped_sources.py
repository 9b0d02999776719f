"""Shipped files cite public sources (papers, repositories, vendor pages), never a local path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import wanspec
from wanspec.sim import LINK_PRESETS

PACKAGE = Path(wanspec.__file__).resolve().parent
# a local notes file, a folder of this machine, a local copy of a paper, a shared checkout: the
# only `shared/` a module may name is `../shared/data`, the documented default data directory
LOCAL = re.compile(r"profiles\.md|/work/|papers/[\w.-]+\.txt|shared/(?!data\b)")


def _shipped() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert any(p.suffix == ".json" for p in files) and any(p.suffix == ".py" for p in files)
    return files


def test_no_shipped_file_cites_a_local_path() -> None:
    cited = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _shipped()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if LOCAL.search(line)
    ]
    assert not cited, "\n".join(cited)


def test_shipped_data_names_no_shared_folder() -> None:
    data = [p for p in _shipped() if p.suffix in (".json", ".jsonl")]
    assert not [p.name for p in data if "shared/" in p.read_text(encoding="utf-8")]


def test_profile_and_link_sources_are_public() -> None:
    folder = PACKAGE / "sim" / "data"
    profiles = sorted(folder.glob("*.json"))
    assert len(profiles) >= 6
    for path in profiles:
        entry = json.loads(path.read_text(encoding="utf-8"))
        assert entry["source"], path.name
        for key in ("source", "batch_source"):
            assert not LOCAL.search(entry.get(key, "")), (path.name, key)
    for name, (_fields, source) in LINK_PRESETS.items():
        assert source and not LOCAL.search(source), name
    # the AceSpec anchors name the paper and its table, not a file
    for name in ("cloud-a100-32b", "cloud-a100x4-70b"):
        source = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))["source"]
        assert "Table I" in source and "Asymmetric Edge-Cloud Collaborative Framework" in source
