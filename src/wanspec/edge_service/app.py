"""The edge as an OpenAI-compatible HTTP service (FastAPI), speculative decoding behind it.

An application speaks `/v1/completions` or `/v1/chat/completions`; each request becomes one
resumable wanspec request against the cloud (`wanspec.net.client.generate_resumable`), on the
same event loop as the HTTP server (the draft runs on a thread of its own per request). With
`stream: true` every batch of tokens the edge machine commits goes out at once as a server-sent
event. A dropped link to the cloud is resumed underneath; the response's `wanspec` field says
how the request went (acceptance, bits per token, rounds, reconnects).

Errors have OpenAI's shape, whatever went wrong: 400 for a bad request (a body that is not a
JSON object, a missing or ill-typed field, a prompt with no tokens, negative `max_tokens`,
`n` > 1, settings wanspec refuses), 404 for an unknown model or path, 503 when the cloud is busy
or unreachable, 502 when it fails the request, 500 for a failure here (its message names the
exception's type only: no traceback, no source path). A request whose HTTP client goes away is
given up at once, and its cloud session closed with `Close`: the cloud would otherwise hold it
for a reconnection that never comes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from wanspec.edge_service import schemas
from wanspec.edge_service.schemas import ChatRequest, CompletionRequest, SamplingRequest
from wanspec.edge_service.text import NoChatTemplate, TextStream, chat_continuation
from wanspec.net.client import (
    ClientOptions,
    RemoteError,
    RemotePair,
    ResumableRun,
    Unreachable,
    generate_resumable,
)
from wanspec.protocols.base import ErrorCode
from wanspec.protocols.registry import get_method
from wanspec.protocols.settings import GenerationSettings

DEFAULT_CHAT_MAX_TOKENS = 256
CLIENT_GONE = 499  # the status of a response nobody is left to read (as nginx logs it)
log = logging.getLogger("wanspec.edge")


class ApiError(Exception):
    """A request the service answers with an OpenAI error object and `status`."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", **extra: Any
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra

    def response(self) -> JSONResponse:
        body = schemas.error_body(str(self), self.kind, **self.extra)
        return JSONResponse(body, status_code=self.status)


def _cloud_error(exc: RemoteError) -> ApiError:
    """How a failed cloud request looks to an HTTP client."""
    if isinstance(exc, Unreachable) or exc.code in (ErrorCode.BUSY, ErrorCode.SHUTDOWN):
        return ApiError(503, f"the cloud cannot take the request: {exc}", "server_error")
    if exc.code in (ErrorCode.BAD_SETTINGS, ErrorCode.LIMIT):
        return ApiError(400, f"the cloud refused the request: {exc}")
    return ApiError(502, f"the cloud failed the request: {exc}", "server_error")


@dataclass
class Job:
    """One HTTP request, ready to run: the edge (a chat's ids ride on it, after an empty prompt),
    prompt text, settings, and what the answer looks like."""

    edge: RemotePair
    prompt: str
    settings: GenerationSettings
    chat: bool
    include_usage: bool
    id: str = ""
    created: int = field(default_factory=schemas.now)


@dataclass
class Outcome:
    """What a finished job produced."""

    text: str
    finish_reason: str
    prompt_tokens: int
    run: ResumableRun
    stats: dict[str, Any]


@dataclass
class EdgeService:
    """The edge's state behind the HTTP API: the loaded edge, where the cloud is, the method
    and its fixed settings (`method_settings`, e.g. gamma), and `max_concurrent` requests at
    a time (the draft model is shared; more would only queue on its cores)."""

    edge: RemotePair
    server: str
    method: str = "xcosd-e"
    options: ClientOptions = field(default_factory=ClientOptions)
    model_id: str = ""
    method_settings: dict[str, Any] = field(default_factory=dict)
    max_concurrent: int = 2
    created: int = field(default_factory=schemas.now)

    def __post_init__(self) -> None:
        self.model_id = self.model_id or self.edge.target_name or "wanspec"
        self._slots = asyncio.Semaphore(self.max_concurrent)

    # ------------------------------------------------------------------ requests → jobs
    def job(
        self, request: SamplingRequest, prompt: str, max_tokens: int, edge: RemotePair | None = None
    ) -> Job:
        if request.model != self.model_id:
            raise ApiError(
                404,
                f"the model {request.model!r} does not exist here; this edge serves "
                f"{self.model_id!r}",
                param="model",
                code="model_not_found",
            )
        try:
            settings = GenerationSettings(
                max_new_tokens=max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=secrets.randbits(63) if request.seed is None else request.seed,
                stop=request.stop_sequences(),
                **self.method_settings,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc
        chat = edge is not None
        edge = edge or self.edge
        self._check_prompt(edge, prompt, "messages" if chat else "prompt")
        kind = "chatcmpl" if chat else "cmpl"
        ids = schemas.new_id(kind)
        return Job(edge, prompt, settings, chat, request.include_usage, ids)

    def _check_prompt(self, edge: RemotePair, prompt: str, param: str) -> None:
        """Refuse a prompt neither side can start from: no target ids (an empty prompt, and a
        tokenizer that adds no BOS), or no draft ids when the method drafts."""
        drafts = get_method(self.method).needs_draft
        if edge.target_encode(prompt) and not (drafts and not edge.draft_encode(prompt)):
            return
        raise ApiError(
            400, f"{param}: no tokens to continue from (the prompt is empty)", param=param
        )

    def completion_job(self, request: CompletionRequest) -> Job:
        try:
            prompt = request.prompt_text()
        except ValueError as exc:
            raise ApiError(400, str(exc), param="prompt") from exc
        return self.job(request, prompt, request.max_tokens or 16)

    def chat_job(self, request: ChatRequest) -> Job:
        messages = [m.as_template_input() for m in request.messages]
        edge = self.edge
        try:
            ids = chat_continuation(edge.target_encode, edge.target_tokenizer, messages)
        except NoChatTemplate as exc:
            raise ApiError(400, str(exc), param="messages") from exc
        except ValueError as exc:
            raise ApiError(500, str(exc), "server_error") from exc
        limit = request.limit(DEFAULT_CHAT_MAX_TOKENS)
        return self.job(request, "", limit, edge.continued(ids))

    # ------------------------------------------------------------------ running a job
    async def run(self, job: Job, on_emit: Callable[[tuple[int, ...]], None]) -> ResumableRun:
        async with self._slots:
            return await generate_resumable(
                job.edge, job.prompt, self.method, job.settings, self.server, self.options,
                on_emit,
            )  # fmt: skip

    def outcome(self, job: Job, run: ResumableRun, text: TextStream, began: float) -> Outcome:
        reason = run.final.record.finish_reason
        finish = "length" if reason == "length" and not text.stopped else "stop"
        prompt_tokens = len(job.edge.target_encode(job.prompt))
        stats = request_stats(run, self.method, job.settings.gamma, time.monotonic() - began)
        return Outcome(text.text, finish, prompt_tokens, run, stats)

    async def complete(self, job: Job) -> Outcome:
        text = TextStream(self.edge.decode, job.settings.stop)
        began = time.monotonic()
        run = await self.run(job, text.push)
        text.finish()
        return self.outcome(job, run, text, began)


def request_stats(run: ResumableRun, method: str, gamma: int, seconds: float) -> dict[str, Any]:
    """The `wanspec` extension field: how the request went on the WAN, over every session it
    took (a reconnection replays frames, which count again)."""
    per_round = [a for part in run.parts for a in part.edge.accepted_per_round]
    up = sum(part.sent.payload_bits for part in run.parts)
    down = sum(part.received.payload_bits for part in run.parts)
    n, rounds = len(run.tokens), len(per_round)
    drafted = rounds * gamma
    return {
        "method": method,
        "new_tokens": n,
        "time_s": seconds,
        "rounds": rounds,
        "mean_accepted": sum(per_round) / rounds if rounds else None,
        "acceptance_rate": sum(per_round) / drafted if drafted and method != "ar" else None,
        "uplink_bits": up,
        "downlink_bits": down,
        "uplink_bits_per_token": up / n if n else None,
        "downlink_bits_per_token": down / n if n else None,
        "reconnects": run.reconnects,
        "restarts": run.restarts,
    }


# ============================================================================ HTTP
def _body(service: EdgeService, job: Job, outcome: Outcome) -> dict[str, Any]:
    if job.chat:
        choice = schemas.chat_choice(outcome.text, outcome.finish_reason, delta=False)
    else:
        choice = schemas.completion_choice(outcome.text, outcome.finish_reason)
    return {
        "id": job.id,
        "object": "chat.completion" if job.chat else "text_completion",
        "created": job.created,
        "model": service.model_id,
        "choices": [choice],
        "usage": schemas.usage(outcome.prompt_tokens, len(outcome.run.tokens)),
        "wanspec": outcome.stats,
    }


def _chunk(service: EdgeService, job: Job, choices: list[Any], **extra: Any) -> str:
    body = {
        "id": job.id,
        "object": "chat.completion.chunk" if job.chat else "text_completion",
        "created": job.created,
        "model": service.model_id,
        "choices": choices,
        **extra,
    }
    return f"data: {json.dumps(body)}\n\n"


def _delta(job: Job, text: str, finish: str | None = None, first: bool = False) -> list[Any]:
    if job.chat:
        return [schemas.chat_choice(text, finish, delta=True, first=first)]
    return [schemas.completion_choice(text, finish)]


# runs given up while their Close is still on its way to the cloud: kept referenced until done
_ENDING: set[asyncio.Task[Any]] = set()


def _give_up(task: asyncio.Task[Any]) -> None:
    """Cancel a request's run (its client went away); on its way out it says Close to the
    cloud (`wanspec.net.client`), which needs no one to wait for it here."""
    if task.done():
        return
    task.cancel()
    _ENDING.add(task)
    task.add_done_callback(_ENDING.discard)


async def _disconnected(request: Request) -> None:
    """Return once the HTTP client has gone away (the body is read: nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(service: EdgeService, job: Job) -> AsyncIterator[str]:
    """Server-sent events: a chunk per batch of committed tokens as the edge commits it, then
    the finish reason (with the `wanspec` stats), usage if asked for, and `[DONE]`. When the
    client goes away, Starlette cancels this generator, and the run is given up."""
    text = TextStream(service.edge.decode, job.settings.stop)
    batches: asyncio.Queue[tuple[int, ...] | None] = asyncio.Queue()
    began = time.monotonic()
    task = asyncio.create_task(service.run(job, batches.put_nowait))
    task.add_done_callback(lambda _: batches.put_nowait(None))
    try:
        if job.chat:
            yield _chunk(service, job, _delta(job, "", first=True))
        while (batch := await batches.get()) is not None:
            if delta := text.push(batch):
                yield _chunk(service, job, _delta(job, delta))
        run = task.result()
        if tail := text.finish():
            yield _chunk(service, job, _delta(job, tail))
        outcome = service.outcome(job, run, text, began)
        yield _chunk(service, job, _delta(job, "", outcome.finish_reason), wanspec=outcome.stats)
        if job.include_usage:
            counts = schemas.usage(outcome.prompt_tokens, len(run.tokens))
            yield _chunk(service, job, [], usage=counts)
    except RemoteError as exc:
        yield f"data: {json.dumps(schemas.error_body(str(exc), 'server_error'))}\n\n"
    except Exception as exc:
        log.exception("a streamed request failed")
        yield f"data: {json.dumps(_internal(exc))}\n\n"
    finally:
        _give_up(task)  # the client went away, or the run is over anyway
    yield "data: [DONE]\n\n"


def _internal(exc: BaseException) -> dict[str, Any]:
    """A failure here, as the client sees it: the exception's type, nothing of where."""
    return schemas.error_body(f"internal error: {type(exc).__name__}", "server_error")


async def _answer(service: EdgeService, job: Job, stream: bool, request: Request) -> Any:
    if stream:
        return StreamingResponse(_events(service, job), media_type="text/event-stream")
    work = asyncio.ensure_future(service.complete(job))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        finished = work.done()
        _give_up(work)  # the client went away (or this handler was cancelled)
    if not finished:
        return ApiError(CLIENT_GONE, "the client went away").response()
    try:
        outcome = work.result()
    except RemoteError as exc:
        return _cloud_error(exc).response()
    return JSONResponse(_body(service, job, outcome))


def create_app(service: EdgeService) -> FastAPI:
    """The FastAPI application serving `service`."""
    app = FastAPI(title="wanspec edge", description="OpenAI-compatible, speculative over a WAN")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own: a body it cannot parse (not UTF-8, nested too deep), no such route
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        detail = exc.detail if isinstance(exc.detail, str) else "invalid request"
        message = f"{detail} ({request.method} {request.url.path})"
        return JSONResponse(schemas.error_body(message, kind), exc.status_code, exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(_internal(exc), status_code=500)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model(service)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != service.model_id:
            raise ApiError(404, f"no model {model_id!r} here", code="model_not_found")
        return _model(service)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, http: Request) -> Any:
        return await _answer(service, service.completion_job(request), request.stream, http)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest, http: Request) -> Any:
        return await _answer(service, service.chat_job(request), request.stream, http)

    return app


def _validation_error(exc: RequestValidationError) -> ApiError:
    """A body FastAPI could not take, as one OpenAI error: the first problem and the field it
    is in (never `str(exc)`, which names this file and line)."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        why = (first.get("ctx") or {}).get("error", "invalid JSON")
        at = f" at character {loc[0]}" if loc else ""
        return ApiError(400, f"the body is not valid JSON: {why}{at}")
    where = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if where is None:
        return ApiError(400, f"the body must be a JSON object: {msg}")
    return ApiError(400, f"{where}: {msg}", param=where)


def _model(service: EdgeService) -> dict[str, Any]:
    return {
        "id": service.model_id,
        "object": "model",
        "created": service.created,
        "owned_by": "wanspec",
    }
