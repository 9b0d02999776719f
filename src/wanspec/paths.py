"""Where wanspec keeps what it caches on this machine (models, assets, tokenizers, profiles).

One lookup of ``$WANSPEC_HOME`` so that every cache moves together when a user points it
elsewhere (a bigger disk, a test's temporary folder). Floor 0: imports nothing from wanspec.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_profiles_dir", "wanspec_home"]


def wanspec_home() -> Path:
    """Root of every wanspec cache: ``$WANSPEC_HOME`` or ``~/.cache/wanspec``."""
    env = os.environ.get("WANSPEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "wanspec"


def user_profiles_dir() -> Path:
    """``$WANSPEC_HOME/profiles``: `wanspec models bench` writes here, `wanspec.sim` reads here."""
    return wanspec_home() / "profiles"
