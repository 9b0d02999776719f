"""`VocabAlignment.fingerprint`: what the handshake compares to know both sides hold one alignment.

Tokenizers are the small trained ones of `wanspec.models.tiny` (real BPE, built in milliseconds).
Widths stay fixed unless a test changes them, so a tokenizer change is seen on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast

from wanspec.models.tiny import build_tokenizer
from wanspec.vocab import VocabAlignment

DRAFT_SIZE, TARGET_SIZE = 150, 300
DRAFT_WIDTH, TARGET_WIDTH = 176, 336


def _draft(extra: int = 0) -> PreTrainedTokenizerFast:
    return build_tokenizer("metaspace", DRAFT_SIZE + extra)


def _target(extra: int = 0) -> PreTrainedTokenizerFast:
    return build_tokenizer("bytelevel", TARGET_SIZE + extra)


def _added(tok: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The same tokenizer plus one added token (every other id and piece unchanged)."""
    tok.backend_tokenizer.add_tokens([AddedToken("<extra>", special=False)])
    return tok


def _build(draft=None, target=None, draft_width=DRAFT_WIDTH, target_width=TARGET_WIDTH):
    return VocabAlignment.build(
        draft or _draft(),
        target or _target(),
        draft_width=draft_width,
        target_width=target_width,
    )


@pytest.fixture(scope="module")
def base() -> VocabAlignment:
    return _build()


def test_fingerprint_is_short_hex_and_stable_across_builds_and_processes(
    base: VocabAlignment, tmp_path: Path
) -> None:
    assert len(base.fingerprint) == 16 and int(base.fingerprint, 16) >= 0
    assert _build().fingerprint == base.fingerprint  # freshly trained, equal tokenizers
    # Another process, with another str hash seed, reading the tokenizers from files agrees.
    files = [tmp_path / "draft.json", tmp_path / "target.json"]
    _draft().backend_tokenizer.save(str(files[0]))
    _target().backend_tokenizer.save(str(files[1]))
    script = (
        "import sys; from tokenizers import Tokenizer; from wanspec.vocab import VocabAlignment\n"
        "d, t = (Tokenizer.from_file(f) for f in sys.argv[1:3])\n"
        "w = dict(draft_width=int(sys.argv[3]), target_width=int(sys.argv[4]))\n"
        "print(VocabAlignment.build(d, t, **w).fingerprint)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *map(str, files), str(DRAFT_WIDTH), str(TARGET_WIDTH)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == base.fingerprint


CHANGES = {
    "draft retrained": lambda: _build(draft=_draft(extra=10)),
    "draft added token": lambda: _build(draft=_added(_draft())),
    "target retrained": lambda: _build(target=_target(extra=10)),
    "target added token": lambda: _build(target=_added(_target())),
    "draft width": lambda: _build(draft_width=DRAFT_WIDTH + 1),
    "target width": lambda: _build(target_width=TARGET_WIDTH + 1),
    "sides swapped": lambda: _build(_target(), _draft(), TARGET_WIDTH, DRAFT_WIDTH),
    "identity of the target": lambda: VocabAlignment.identity(_target(), TARGET_WIDTH),
}


@pytest.mark.parametrize("change", CHANGES)
def test_fingerprint_changes_with_either_tokenizer_or_width(
    base: VocabAlignment, change: str
) -> None:
    assert CHANGES[change]().fingerprint != base.fingerprint
