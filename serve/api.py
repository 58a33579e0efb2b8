"""The HTTP API of one worker (FastAPI): SGLang's /generate, OpenAI's /v1, and the info routes.

The three generation routes share one path, differing only in their ``Route`` (body schema,
reduction, renderer): parse and validate the body -> one ``GenRequest`` (schemas.py) -> the
worker starts it, so an invalid request (the engine's ``InvalidRequest``) is a 4xx before any
byte is sent -> its stream of engine records folds into a ``Result`` -> rendered per API
(responses.py), whole or as SSE.

Other routes: ``GET /v1/models``, ``/health``, ``/health_generate``, ``/model_info`` =
``/get_model_info``, ``/server_info`` = ``/get_server_info``, ``POST /flush_cache``,
``GET /metrics``, ``GET /pd_trace``. Every error answer has one shape (errors.py); nothing a
client sends can take the server down. The app knows a worker's public methods and its model
card; roles, engines and transfers live behind them.

Faults (docs/serving.md): a body over ``HttpLimits.max_body_bytes`` is refused (413) before it is
read whole; a client that disconnects aborts its request, streaming or not (``until_gone``); a
streaming client that accepts nothing for ``stream_send_timeout_s`` is dropped and its request
aborted (``SseResponse``); a failure after the stream started ends it with an SSE error event;
``/health`` answers 503 once the engine thread has died, so the supervisor restarts the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask
from starlette.types import Message, Send

from glmlab.core import InvalidRequest
from glmlab.serve import chat
from glmlab.serve.errors import RequestError, ServeError, error_body, error_response
from glmlab.serve.generation import merge, open_batch
from glmlab.serve.grammar import GrammarCache
from glmlab.serve.limits import HttpLimits
from glmlab.serve.metrics import ServeMetrics
from glmlab.serve.responses import (
    ChatRenderer,
    CompletionRenderer,
    Renderer,
    SglangRenderer,
)
from glmlab.serve.schemas import (
    ChatBody,
    CompletionBody,
    GenerateBody,
    from_completion,
    from_generate,
)
from glmlab.tokenizer import TokenizerError


async def read_body(request: Request, limits: HttpLimits) -> bytes:
    """The body, refused (413) past the cap: by its Content-Length before any byte is read, else
    as soon as the bytes received pass it."""
    limits.check_length(request.headers.get("content-length"))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise limits.too_large(f"more than {limits.max_body_bytes} bytes sent so far")
        chunks.append(chunk)
    return b"".join(chunks)


def _not_a_number(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _value_problem(value, path: str = "") -> str | None:
    """Where the parsed body holds what is valid JSON but no value: a string with a lone UTF-16
    surrogate (an escape like \\ud800, not Unicode text), a number too large for a float."""
    where = path or "body"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{where}: character {e.start} is a lone surrogate " \
                   f"({value[e.start]!a}), not Unicode text"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: the number is too large for a float"
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        problem = _value_problem(item, f"{path}.{key}" if path else str(key))
        if problem:
            return problem
    return None


async def parse_body(request: Request, model: type[BaseModel], limits: HttpLimits):
    raw = await read_body(request, limits)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the request body is not valid UTF-8 (byte {e.start} is "
                           f"{raw[e.start:e.start + 1]!r})", param="body") from e
    try:  # strict: raw control characters in strings and NaN / Infinity are not JSON
        data = json.loads(text, parse_constant=_not_a_number)
    except ValueError as e:
        raise RequestError(f"the request body is not valid JSON: {e}", param="body") from e
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}",
                           param="body")
    problem = _value_problem(data)
    if problem:
        raise RequestError(f"invalid request: {problem}", param=problem.split(":")[0])
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
                             for err in e.errors()[:5])
        raise RequestError(f"invalid request: {problems}") from e


@dataclass(frozen=True)
class Route:
    """What one generation API adds to the shared path."""

    body: type[BaseModel]
    reduce: Callable  # (body, card) -> GenBatch
    renderer: type[Renderer]
    parsers: Callable = lambda _body, _card: None  # chat: reasoning / tool-call parsers


ROUTES = {
    "/generate": Route(GenerateBody, lambda body, _card: from_generate(body), SglangRenderer),
    "/v1/completions": Route(CompletionBody, lambda body, _card: from_completion(body),
                             CompletionRenderer),
    "/v1/chat/completions": Route(ChatBody, chat.reduce, ChatRenderer, chat.parsers_for),
}


class Api:
    """The shared path of the generation routes, over one worker."""

    def __init__(self, worker):
        self.worker, self.card = worker, worker.card
        self.limits: HttpLimits = worker.wc.limits
        self.metrics = ServeMetrics(worker.stats)
        self.grammars = GrammarCache(worker.card.tokenizer, worker.engine.model.cfg.vocab_size)

    async def handle(self, request: Request, route: Route):
        body = await parse_body(request, route.body, self.limits)
        card = self.card
        if not card.accepts(body.model):
            raise RequestError(f"model {body.model!r} not found: this server serves "
                               f"{card.served_model_name!r}", status=404, param="model")
        batch = await self.grammars.compile_for(route.reduce(body, card))
        options = getattr(body, "stream_options", None)
        render = route.renderer(batch, card.served_model_name, card.tokenizer,
                                bool(options and options.include_usage),
                                route.parsers(body, self.worker.wc))
        try:
            subs = await open_batch(self.worker, batch, card.tokenizer.encode)
        except InvalidRequest as e:
            raise RequestError(str(e), param=e.field) from e

        async def close():
            for s in subs:
                await s.records.aclose()

        if not batch.stream:
            async def whole():
                for s in subs:  # records queue per request: reading in turn loses nothing
                    async for _ in s.results(self._finished):
                        pass
                return render.whole([s.result for s in subs])

            return await until_gone(request, whole(), close)
        # closing the records after the response also covers a client gone before the first
        # chunk, when the stream never started (a started one closes them itself)
        return sse(self._events(render, subs), BackgroundTask(close),
                   self.limits.stream_send_timeout_s)

    def _finished(self, sub, ttft: float | None, e2e: float, gaps=()) -> None:
        r = sub.result
        status = r.finish_reason.value if r.finish_reason is not None else "error"
        # a prompt counts once for its n samples, as the answer's usage counts it
        prompt, cached = (r.prompt_tokens, r.cached_tokens) if sub.sample == 0 else (0, 0)
        self.metrics.finished(status, prompt, r.completion_tokens, cached, ttft, e2e, gaps)

    async def _events(self, render: Renderer, subs) -> AsyncIterator[dict]:
        for e in render.head():
            yield e
        async for r in merge([s.results(self._finished) for s in subs]):
            chunk = render.chunk(r)
            if chunk is not None:
                yield chunk
        for e in render.tail([s.result for s in subs]):
            yield e


async def until_gone(request: Request, work: Awaitable, close: Callable[[], Awaitable[None]]):
    """``await work``, unless the client disconnects first: then ``work`` is cancelled (its
    request aborted) and nobody reads the answer. Non-streaming answers need this because
    nothing is sent before the end, so nothing else would notice the client leave."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await close()
    return Response(status_code=499)  # nginx's "client closed request"; the client is gone


async def _disconnect(request: Request) -> None:
    # the body has been read whole, so the next message is the disconnect, whenever it comes
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _ClientTooSlow(Exception):
    pass


class SseResponse(StreamingResponse):
    """A stream whose every send must finish within ``send_timeout_s``: a client that stopped
    reading is dropped (its request aborted), never waited for; the engine never waits either
    way (records queue per request)."""

    def __init__(self, content, background: BackgroundTask, send_timeout_s: float):
        super().__init__(content, media_type="text/event-stream", background=background)
        self.send_timeout_s = send_timeout_s

    async def stream_response(self, send: Send) -> None:
        async def timed(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout_s)
            except asyncio.TimeoutError:
                raise _ClientTooSlow from None

        try:
            await super().stream_response(timed)
        except _ClientTooSlow:
            pass  # returning without ending the response makes the server close the socket
        finally:
            await self.body_iterator.aclose()


def sse(events: AsyncIterator[dict], background: BackgroundTask,
        send_timeout_s: float = 30.0) -> StreamingResponse:
    async def body():
        try:
            async for e in events:
                yield f"data: {json.dumps(e)}\n\n"
        except ServeError as e:
            yield f"data: {json.dumps(error_body(e.status, str(e)))}\n\n"
        except Exception as e:  # noqa: BLE001 - after the head, an error can only be an event
            yield f"data: {json.dumps(error_body(500, f'{type(e).__name__}: {e}'))}\n\n"
        yield "data: [DONE]\n\n"

    return SseResponse(body(), background, send_timeout_s)


def build_app(worker) -> FastAPI:
    api = Api(worker)
    card = api.card
    app = FastAPI(title=f"glmlab {card.role} worker", docs_url=None, redoc_url=None)
    app.state.api = api

    @app.exception_handler(RequestError)
    async def on_request_error(_req, e: RequestError):
        return error_response(e.status, str(e), e.param)

    @app.exception_handler(ServeError)
    async def on_serve_error(_req, e: ServeError):
        return error_response(e.status, str(e))

    @app.exception_handler(TokenizerError)
    async def on_tokenizer_error(_req, e: TokenizerError):
        return error_response(400, str(e))

    def generation(route: Route):
        async def generate(request: Request):
            return await api.handle(request, route)
        return generate

    for path, route in ROUTES.items():
        app.post(path)(generation(route))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": card.served_model_name, "object": "model", "created": 0, "owned_by": "glmlab",
            "root": str(card.model_dir), "max_model_len": card.context_len}]}

    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        failure = worker.thread.failure
        if failure:  # answered so the supervisor restarts this worker
            return error_response(503, "the engine thread died: " + failure.splitlines()[-1])
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        # a local directory holding tokenizer.json: the router must not look for it online
        return {"model_path": str(card.model_dir), "tokenizer_path": str(card.model_dir),
                "is_generation": True, "served_model_name": card.served_model_name,
                "model_type": card.model_type, "architectures": list(card.architectures),
                "max_context_len": card.context_len}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return await worker.server_info()

    @app.post("/flush_cache")
    @app.get("/flush_cache")
    async def flush_cache():
        ok = await worker.flush_cache()
        return Response("Cache flushed.\n" if ok else "Cache not flushed: requests are running.\n",
                        status_code=200 if ok else 400)

    @app.get("/metrics")
    async def metrics():
        return Response(api.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/pd_trace")
    async def pd_trace():
        return {"events": worker.timeline.recent()}

    return app
