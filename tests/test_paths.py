"""wanspec.paths: the one WANSPEC_HOME lookup every cache follows, and the free-space check."""

from __future__ import annotations

import json
import shutil
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
