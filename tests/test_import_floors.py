"""What each floor loads when imported: the protocols build jobs and decide without model code,
and the plain-data modules under them need nothing but numpy. Each import runs in a fresh
interpreter, so a module another test loaded cannot hide a heavy import."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded_after(statement: str, heavy: tuple[str, ...]) -> list[str]:
    """The `heavy` top-level packages loaded by running `statement` in a fresh interpreter."""
    probe = f"import sys\n{statement}\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.split()


def test_the_protocols_load_no_model_code() -> None:
    modules = "import wanspec.protocols.registry, wanspec.protocols.pipeline, wanspec.jobs"
    assert _loaded_after(modules, ("transformers", "wanspec.models.lm")) == []


@pytest.mark.parametrize("module", ["wanspec.jobs", "wanspec.models.batch_policy", "wanspec.wire"])
def test_plain_data_modules_need_nothing_but_numpy(module: str) -> None:
    assert _loaded_after(f"import {module}", ("torch", "transformers")) == []
