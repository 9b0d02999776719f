"""Where wanspec keeps what it caches on this machine (models, assets, tokenizers, profiles).

One lookup of ``$WANSPEC_HOME`` so that every cache moves together when a user points it
elsewhere (a bigger disk, a test's temporary folder), and one check that the disk there can take
a large download or conversion. Floor 0: imports nothing from wanspec.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["check_free_space", "user_profiles_dir", "wanspec_home"]


def wanspec_home() -> Path:
    """Root of every wanspec cache: ``$WANSPEC_HOME`` or ``~/.cache/wanspec``."""
    env = os.environ.get("WANSPEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "wanspec"


def user_profiles_dir() -> Path:
    """``$WANSPEC_HOME/profiles``: `wanspec models bench` writes here, `wanspec.sim` reads here."""
    return wanspec_home() / "profiles"


def check_free_space(folder: Path, needed: int, what: str, *, error: type[Exception]) -> None:
    """Create `folder` and raise `error` unless it has `needed` bytes free: fail before a long
    download or conversion rather than with a full disk in the middle of it."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise error(
            f"not enough disk space for {what}: {free / 2**30:.1f} GiB free under {folder}, "
            f"need about {needed / 2**30:.1f} GiB (set WANSPEC_HOME elsewhere?)"
        )
