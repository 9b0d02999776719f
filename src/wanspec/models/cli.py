"""``wanspec models``: list, pull, inspect and benchmark the registry models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from wanspec.assets import AssetError, artifact_path, is_cached
from wanspec.models import registry
from wanspec.models.convert import ConversionError

__all__ = ["USER_ERRORS", "loading_kwargs", "loading_options", "models"]

# What a command shows as a message, not a traceback: caused by what the user asked for.
USER_ERRORS = (ValueError, FileNotFoundError, AssetError, ConversionError, registry.ModelError)
DTYPES = ("float32", "bfloat16", "float16")


def _checked_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--device, refused as a usage error before anything loads when this machine lacks it."""
    if value == "cpu":
        return value  # always present: no need to import torch to know
    from wanspec.models.lm import resolve_device

    try:
        resolve_device(value)
    except ValueError as err:
        raise click.BadParameter(str(err), ctx=ctx, param=param) from err
    return value


def loading_options(f: Any) -> Any:
    """--dtype, --invariant and --device, for every command that loads a model (`wanspec serve`,
    `generate`, `demo`, `edge`, `bench`); `loading_kwargs` turns them into `load_model`'s
    arguments."""
    f = click.option(
        "--device",
        default="cpu",
        show_default=True,
        callback=_checked_device,
        metavar="DEVICE",
        help="Where the models' weights and KV caches live: cpu, cuda, cuda:N or mps.",
    )(f)
    f = click.option(
        "--invariant/--no-invariant",
        default=None,
        help="Pass-shape-invariant kernels: a position's logits do not depend on the pass that "
        "computes them, so a batch's tokens never depend on its neighbours [default: on for "
        "bfloat16 and float16, which require it; off for float32].",
    )(f)
    return click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default="float32",
        show_default=True,
        help="Dtype of the loaded models' weights.",
    )(f)


def loading_kwargs(dtype: str, invariant: bool | None, device: str = "cpu") -> dict[str, Any]:
    """`load_model` / `load_pair` keyword arguments for the given --dtype, --invariant and
    --device (the models themselves decide what None means and refuse a 16-bit dtype without
    invariance)."""
    import torch

    return {"dtype": getattr(torch, dtype), "invariant": invariant, "device": device}


@click.group("models")
def models() -> None:
    """Pretrained models pulled from pinned registry artifacts."""


@models.command("list")
def list_models() -> None:
    """Show the known models and whether each is already cached."""
    rows = [("NAME", "FAMILY", "DTYPE", "GGUF", "STATUS", "DESCRIPTION")]
    for spec in registry.MODELS.values():
        rows.append(
            (
                spec.name,
                spec.family,
                spec.dtype,
                _human(spec.artifact.size),
                _status(spec.name),
                spec.description,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]))


def _status(name: str) -> str:
    if registry.is_pulled(name):
        return "pulled"
    if is_cached(registry.get_model(name).artifact):
        return "gguf only"
    return "-"


@models.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="Convert again even if the folder is current.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def pull_model(name: str, force: bool, quiet: bool) -> None:
    """Fetch NAME's GGUF and convert it into a cached Hugging Face folder."""
    try:
        report = registry.pull(name, progress=not quiet, force=force)
    except USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    if report.cached:
        click.echo(f"{name}: already pulled at {report.path}")
        return
    click.echo(
        f"{name}: fetch {report.fetch_seconds:.1f} s, convert {report.convert_seconds:.1f} s, "
        f"{_human(_disk_usage(report.path))} at {report.path}"
    )


@models.command("info")
@click.argument("name_or_path")
def info(name_or_path: str) -> None:
    """Architecture, parameter count, vocab sizes, dtype, cache paths (pulls if needed)."""
    try:
        folder = registry.resolve_model(name_or_path)
        tokenizer = registry.load_tokenizer(folder)
    except USER_ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    for key, value in describe(folder, len(tokenizer)).items():
        click.echo(f"{key + ':':<18}{value}")


def describe(folder: Path, tokenizer_size: int) -> dict[str, Any]:
    """Facts about a Hugging Face folder, read from its files without loading the weights."""
    config = json.loads((folder / "config.json").read_text())
    manifest = registry.read_manifest(folder) or {}
    params, embed_rows = _safetensors_counts(folder)
    facts: dict[str, Any] = {
        "folder": folder,
        "architecture": ", ".join(config.get("architectures") or [config.get("model_type", "?")]),
        "parameters": f"{params:,}",
        "layers": config.get("num_hidden_layers", "?"),
        "hidden size": config.get("hidden_size", "?"),
        "tokenizer vocab": f"{tokenizer_size:,}",
        "embedding rows": f"{embed_rows:,} (logits width)",
        "tied embeddings": config.get("tie_word_embeddings", "?"),
        "dtype": manifest.get("dtype") or config.get("dtype") or config.get("torch_dtype", "?"),
        "disk": _human(_disk_usage(folder)),
    }
    if manifest:
        spec = registry.get_model(manifest["name"])
        facts["gguf"] = f"{artifact_path(spec.artifact)} ({_human(spec.artifact.size)})"
        facts["gguf sha256"] = manifest.get("sha256", "?")
        facts["tokenizer cache"] = registry.tokenizer_dir(spec.family, progress=False)
    return facts


def _safetensors_counts(folder: Path) -> tuple[int, int]:
    """(parameter count, embedding rows) from the safetensors headers alone."""
    from safetensors import safe_open

    total, embed_rows = 0, 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                shape = handle.get_slice(key).get_shape()
                count = 1
                for dim in shape:
                    count *= dim
                total += count
                if key.endswith("embed_tokens.weight"):
                    embed_rows = shape[0]
    return total, embed_rows


@models.command("bench")
@click.argument("name_or_path")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Profile JSON path.")
def bench(name_or_path: str, out: str | None) -> None:
    """Measure NAME's forward latencies and write a compute profile."""
    from wanspec.models.profile import bench_command

    bench_command(name_or_path, out)


def _disk_usage(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _human(size: float) -> str:
    units = ("B", "KB", "MB", "GB", "TB")
    step = 0
    while size >= 1000 and step < len(units) - 1:
        size /= 1000
        step += 1
    return f"{size:.0f} B" if step == 0 else f"{size:.1f} {units[step]}"
