"""The HTTP API of one worker (FastAPI): SGLang's /generate, OpenAI's /v1, and the info routes.

Routes: ``POST /generate``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE),
``GET /v1/models``, ``/health``, ``/health_generate``, ``/model_info`` = ``/get_model_info``,
``/server_info`` = ``/get_server_info``, ``POST /flush_cache``, ``GET /metrics``, ``GET /pd_trace``.

Every bad request gets a 4xx with a message naming the problem, in one error shape
(``{"error": {"message", "type", "param", "code"}}``); nothing a client sends can take the server
down. The app knows a ``Backend`` (backend.py) and the tokenizer; roles, engines and transfers
live behind the backend.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from glmlab.serve import oai
from glmlab.serve.backend import Backend, Finish, ServeError
from glmlab.serve.metrics import ServeMetrics
from glmlab.serve.schemas import (
    ChatBody,
    CompletionBody,
    GenerateBody,
    GenRequest,
    RequestError,
    from_chat,
    from_completion,
    from_generate,
)
from glmlab.serve.textstream import TextStream
from glmlab.tokenizer import TokenizerError


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status)


async def parse_body(request: Request, model: type[BaseModel]):
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
                             for err in e.errors()[:5])
        raise RequestError(f"invalid request: {problems}") from e


@dataclass
class Update:
    """One step of a request as the APIs see it: new text and tokens, and the end."""

    delta: str
    new_ids: tuple[int, ...]
    new_logprobs: tuple[float, ...] | None
    finish: Finish | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    meta: dict


class Api:
    def __init__(self, backend: Backend):
        self.backend, self.card = backend, backend.card
        self.metrics = ServeMetrics(backend.stats)

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """Tokenize and check the prompt against the vocabulary and the context length."""
        card = self.card
        ids = list(req.input_ids) if req.input_ids is not None else card.tokenizer.encode(req.text)
        if not ids:
            raise RequestError("the prompt is empty", param="prompt")
        bad = [i for i in ids if not 0 <= i < card.vocab_size]
        if bad:
            raise RequestError(f"token ids out of range [0, {card.vocab_size}): {bad[:5]}",
                               param="input_ids")
        need = len(ids) + req.params.max_new_tokens
        if need > card.context_len:
            raise RequestError(f"the prompt ({len(ids)} tokens) plus max_new_tokens "
                               f"({req.params.max_new_tokens}) is {need} tokens, over the context "
                               f"length of {card.context_len}", param="max_new_tokens")
        return ids

    async def run(self, req: GenRequest, ids: list[int]) -> AsyncIterator[Update]:
        """The backend's events turned into text deltas; stop strings end the request here."""
        tok = self.card.tokenizer
        text = TextStream(lambda x: tok.decode(x, skip_special_tokens=req.skip_special_tokens),
                          req.params.stop, keep_stop=req.no_stop_trim)
        start, first, cached, status = time.perf_counter(), None, 0, "error"
        stream = self.backend.generate(req, ids)
        try:
            async for ev in stream:
                first = first if first is not None or not ev.new_ids else time.perf_counter()
                cached = ev.cached_tokens
                finish = ev.finish
                delta = text.add(list(ev.new_ids), final=finish is not None)
                if text.matched_stop is not None and finish is None:
                    finish = Finish("stop", text.matched_stop)
                yield Update(delta, ev.new_ids, ev.new_logprobs, finish, len(ids),
                             len(text.ids), cached, ev.meta)
                if finish is not None:
                    status = finish.kind
                    break
        finally:
            await stream.aclose()  # aborts the request in the worker if it is still running
            ttft = None if first is None else first - start
            self.metrics.finished(status, len(ids), len(text.ids), cached, ttft,
                                  time.perf_counter() - start)

    async def collect(self, req: GenRequest, ids: list[int]) -> tuple[Update, str, list, list]:
        """Run to the end: (last update, full text, all ids, all logprobs)."""
        text, out_ids, logprobs, last = "", [], [], None
        async for u in self.run(req, ids):
            text += u.delta
            out_ids.extend(u.new_ids)
            logprobs.extend(u.new_logprobs or ())
            last = u
        return last, text, out_ids, logprobs


def sse(events: AsyncIterator[dict]) -> StreamingResponse:
    async def body():
        try:
            async for e in events:
                yield f"data: {json.dumps(e)}\n\n"
        except ServeError as e:
            yield f"data: {json.dumps({'error': {'message': str(e), 'code': e.status}})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def build_app(backend: Backend) -> FastAPI:
    api = Api(backend)
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

    def check_model(name: str | None) -> None:
        if not card.accepts(name):
            raise RequestError(f"model {name!r} not found: this server serves "
                               f"{card.served_model_name!r}", status=404, param="model")

    @app.post("/generate")
    async def generate(request: Request):
        body = await parse_body(request, GenerateBody)
        check_model(body.model)
        req = from_generate(body)
        ids = api.prompt_ids(req)
        if req.stream:
            return sse(oai.sglang_stream(api, req, ids))
        return oai.sglang_response(req, *(await api.collect(req, ids)))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse_body(request, CompletionBody)
        check_model(body.model)
        req = from_completion(body)
        ids = api.prompt_ids(req)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if req.stream:
            return sse(oai.completion_stream(api, req, ids, card.served_model_name,
                                             include_usage))
        return oai.completion_response(req, card.served_model_name, card.tokenizer,
                                       *(await api.collect(req, ids)))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await parse_body(request, ChatBody)
        check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        prompt = card.tokenizer.apply_chat_template(
            messages, add_generation_prompt=not body.continue_final_message)
        req = from_chat(body, prompt)
        ids = api.prompt_ids(req)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        if req.stream:
            return sse(oai.chat_stream(api, req, ids, card.served_model_name, include_usage))
        return oai.chat_response(req, card.served_model_name, *(await api.collect(req, ids)))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": card.served_model_name, "object": "model", "created": 0, "owned_by": "glmlab",
            "root": str(card.model_dir), "max_model_len": card.context_len}]}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
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
        return backend.server_info()

    @app.post("/flush_cache")
    @app.get("/flush_cache")
    async def flush_cache():
        ok, message = await backend.flush_cache()
        return Response(message, status_code=200 if ok else 400)

    @app.get("/metrics")
    async def metrics():
        return Response(api.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/pd_trace")
    async def pd_trace():
        return {"events": backend.trace()}

    return app
