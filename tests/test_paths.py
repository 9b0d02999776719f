"""wanspec.paths: the one WANSPEC_HOME lookup every cache follows, the free-space check, and the
lock that makes processes filling one cache entry take turns."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wanspec import assets, paths
from wanspec.assets import AssetError
from wanspec.models import registry
from wanspec.models.convert import ConversionError
from wanspec.models.profile import default_profile_path
from wanspec.sim.profiles import available_profiles, load_profile


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return tmp_path / "user"


@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty_home_is_the_user_cache(
    user_home: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("WANSPEC_HOME", raising=False)
    else:
        monkeypatch.setenv("WANSPEC_HOME", value)
    assert paths.wanspec_home() == user_home / ".cache" / "wanspec"


def test_every_cache_follows_one_home_with_tilde(
    user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Assets, models, tokenizers and both ends of the profile folder move together."""
    monkeypatch.setenv("WANSPEC_HOME", "~/elsewhere")
    home = user_home / "elsewhere"
    assert paths.wanspec_home() == home
    assert assets.artifact_path(assets.get_artifact("smollm2-135m")).is_relative_to(home / "assets")
    assert registry.model_dir("smollm2-135m") == home / "models" / "smollm2-135m"
    written = default_profile_path({"name": "this-box"})
    assert written == paths.user_profiles_dir() / "this-box.json" == home / "profiles/this-box.json"
    written.parent.mkdir(parents=True)
    written.write_text(json.dumps({"name": "this-box", "forward_ms": {"1": [2.0]}}))
    assert "this-box" in available_profiles()  # what bench writes, the simulator finds by name
    assert load_profile("this-box").name == "this-box"


@pytest.mark.parametrize("error", [AssetError, ConversionError])
def test_free_space_check_raises_the_callers_error(tmp_path: Path, error: type) -> None:
    folder = tmp_path / "new" / "cache"
    paths.check_free_space(folder, 1, "a small file", error=error)
    assert folder.is_dir()  # created, so the caller can write into it next
    too_much = shutil.disk_usage(folder).free + (1 << 40)
    with pytest.raises(error, match=r"not enough disk space for a huge file: .* WANSPEC_HOME"):
        paths.check_free_space(folder, too_much, "a huge file", error=error)


# ----------------------------------------------------------------------------- cache locks


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WANSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_second_holder_of_a_cache_lock_waits_and_says_why(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two threads open the lock file apart, as two processes do: the second enters only once
    the first has left, after printing its notice; another key is never held up."""
    order: list[str] = []
    second_waits = threading.Event()

    def second() -> None:
        second_waits.set()
        with paths.cache_lock("model-x", notice="waiting for model-x"):
            order.append("second in")

    with paths.cache_lock("model-x"):
        order.append("first in")
        thread = threading.Thread(target=second)
        thread.start()
        second_waits.wait(5)
        with paths.cache_lock("model-y"):  # a different entry: free at once
            order.append("other key")
        thread.join(0.3)
        assert thread.is_alive()  # still waiting for the first holder
        order.append("first out")
    thread.join(10)
    assert order == ["first in", "other key", "first out", "second in"]
    assert "waiting for model-x" in capsys.readouterr().err
    assert (home / "locks" / "model-x.lock").is_file()


def test_a_cache_lock_is_free_again_when_its_holder_is_killed(home: Path) -> None:
    """The kernel drops the lock of a process that dies mid-pull: the next pull goes ahead."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom wanspec.paths import cache_lock\n"
         "with cache_lock('asset-x'):\n    print('held', flush=True)\n    time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        entered = threading.Event()

        def take() -> None:
            with paths.cache_lock("asset-x"):
                entered.set()

        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        assert not entered.wait(0.3)  # held by the other process
    finally:
        holder.kill()
        holder.wait()
    assert entered.wait(30)


@pytest.mark.parametrize("key", ["", "../x", "a/b", ".hidden", "a b"])
def test_a_cache_lock_key_is_one_plain_file_name(home: Path, key: str) -> None:
    with pytest.raises(ValueError, match="bad cache lock key"), paths.cache_lock(key):
        pass
