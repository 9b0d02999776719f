"""Where wanspec keeps what it caches on this machine (models, assets, tokenizers, profiles).

One lookup of ``$WANSPEC_HOME`` so that every cache moves together when a user points it
elsewhere (a bigger disk, a test's temporary folder), one check that the disk there can take
a large download or conversion, and one lock per cache entry so that processes filling the same
entry at once (test workers, two commands started together) build it once, one after the other.
Floor 0: imports nothing from wanspec.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["cache_lock", "check_free_space", "locks_dir", "user_profiles_dir", "wanspec_home"]


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


def locks_dir() -> Path:
    """``$WANSPEC_HOME/locks``: one small lock file per cache entry ever filled (kept: removing a
    lock file another process waits on would let a third one take a fresh lock beside it)."""
    return wanspec_home() / "locks"


@contextmanager
def cache_lock(key: str, notice: str | None = None) -> Iterator[None]:
    """Hold the exclusive lock of the cache entry `key` (``"asset-smollm2-135m"``) while filling it.

    A second process (or thread) asking for the same key waits until the first one is done, then
    finds the entry complete and reuses it: one download, one conversion. The lock is an advisory
    ``flock`` on ``locks_dir()/<key>.lock``; the kernel releases it when its holder exits, even
    killed, so a crashed pull never blocks the next one. `notice`, when given, is printed to
    stderr once if the lock is held elsewhere (a long wait then says why).
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", key):
        raise ValueError(f"bad cache lock key {key!r}")
    folder = locks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{key}.lock").open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if notice:
                print(notice, file=sys.stderr, flush=True)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
