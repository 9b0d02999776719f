"""`wanspec edge`: the edge as a local OpenAI-compatible endpoint in front of a `wanspec serve`
cloud. Heavy imports (torch, FastAPI, uvicorn) happen only when the command runs, and so do
those of `wanspec.cli`, which attaches this command (importing it here would be circular); the
model-loading options come from `wanspec.models.cli` and the generation settings' from
`wanspec.settings_cli`, as `wanspec.cli`'s do."""

from __future__ import annotations

from typing import Any

import click

from wanspec.models.cli import loading_kwargs, loading_options
from wanspec.settings_cli import settings_options


@click.command("edge")
@click.option("--server", required=True, metavar="HOST:PORT", help="The `wanspec serve` cloud.")
@click.option("--draft", default=None, help="Draft model [as `wanspec generate`].")
@click.option(
    "--target",
    default=None,
    help="The target's tokenizer (registry name or folder; the model stays in the cloud) "
    "[as `wanspec generate`].",
)
@click.option("--method", default="xcosd-e", show_default=True, help="See `wanspec methods`.")
@settings_options(only=["gamma"])
@click.option("--listen", default="127.0.0.1:8000", show_default=True, metavar="HOST:PORT")
@click.option("--model-name", default=None, help="Model id to serve [the cloud's target name].")
@click.option("--token", envvar="WANSPEC_TOKEN", default=None, help="The cloud's bearer token.")
@click.option("--tls", is_flag=True, help="Reach the cloud over TLS (system CAs).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option(
    "--reconnect-attempts",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Tries to reach the cloud again after a dropped link (backoff 0.1 s doubling to 2 s).",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds.",
)
@click.option("--max-concurrent", type=click.IntRange(1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=None, help="Torch threads [2].")
@loading_options
def edge(
    server: str,
    draft: str | None,
    target: str | None,
    method: str,
    gamma: int,
    listen: str,
    model_name: str | None,
    token: str | None,
    tls: bool,
    tls_ca: str | None,
    reconnect_attempts: int,
    connect_timeout: float,
    max_concurrent: int,
    threads: int | None,
    dtype: str,
    invariant: bool | None,
    device: str,
) -> None:
    """Serve /v1/models, /v1/completions and /v1/chat/completions on --listen, each request
    decoded speculatively with the draft here and the target on --server; a dropped link to
    the cloud is resumed."""
    from wanspec.models.cli import USER_ERRORS
    from wanspec.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
    from wanspec.net.client import ClientOptions, RemoteError
    from wanspec.net.resume import RetryPolicy
    from wanspec.net.units import parse_address

    options = ClientOptions(
        token=token,
        tls_ca=tls_ca or (True if tls else None),
        connect_timeout_s=connect_timeout,
        resume=True,
        retry=RetryPolicy(attempts=reconnect_attempts),
    )
    try:
        host, port = parse_address(listen)
        loading = {"threads": threads, "model_id": model_name, "max_concurrent": max_concurrent}
        loading.update(loading_kwargs(dtype, invariant, device))
        models = (draft or DEFAULT_DRAFT, target or DEFAULT_TARGET)
        service = _service(server, *models, method, gamma, options, **loading)
    except (*USER_ERRORS, RemoteError) as err:
        raise click.ClickException(str(err)) from err
    _serve(service, host, port)


def _service(
    server: str,
    draft: str,
    target: str,
    method: str,
    gamma: int,
    options: Any,
    *,
    threads: int | None,
    model_id: str | None,
    max_concurrent: int,
    dtype: Any,
    invariant: bool | None,
    device: str = "cpu",
) -> Any:
    from wanspec.edge_service.app import EdgeService
    from wanspec.models.lm import load_model
    from wanspec.models.registry import resolve_model
    from wanspec.net.client import load_edge
    from wanspec.protocols.registry import get_method

    name = get_method(method).name  # an unknown method fails here, before any loading
    draft_lm = load_model(
        resolve_model(draft), threads=threads, dtype=dtype, invariant=invariant, device=device
    )
    edge = load_edge(draft_lm, target, server, options, draft_name=draft)
    return EdgeService(
        edge,
        server,
        name,
        options,
        model_id=model_id or "",
        method_settings={"gamma": gamma},
        max_concurrent=max_concurrent,
    )


def _serve(service: Any, host: str, port: int) -> None:
    import uvicorn

    from wanspec.edge_service.app import create_app

    click.echo(
        f"wanspec edge: {service.model_id} via {service.server} ({service.method}) on "
        f"http://{host}:{port}/v1"
    )
    uvicorn.run(create_app(service), host=host, port=port, log_level="info")
