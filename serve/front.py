"""The service's front: its one public address, in front of sglang-router (aiohttp, one thread).

sglang-router 0.3.2 answers unknown paths 404 and proxies none, and its own ``/get_server_info``
describes the router, so the paths that describe the *service* are served here and every other
request is passed to the router unchanged (body, query, headers but hop-by-hop ones):

- ``GET /health``: 200 while every child is up, else 503 naming what died and whether it is being
  restarted (the supervisor's view, ``Service.health``);
- ``GET /server_info``: the service's state and one row per worker (``worker_row``): ``role, url,
  running, waiting, used_pages, used_state_slots, pending_transfers`` and what the radix cache
  holds, so anyone can check from outside that the pools are back to empty;
- the routes in ``EXTRA_ROUTES`` (the place for ``/metrics`` aggregated over the workers).

What a client sees when something breaks: a body over ``max_body_bytes`` is refused with 413
before it is read (``HttpLimits``); a router that does not answer gives 503, one that breaks off
gives 502, and a stream cut mid-way (a worker died) ends with an SSE error event and ``[DONE]``,
each message naming the child that died (``Service.health``). A client that stops reading a
stream for ``stream_send_timeout_s`` is dropped; a client that goes away (either kind of request)
closes the upstream connection, which the router passes on to the workers, which abort the
request. This module knows HTTP and the supervisor's read-only view; not the engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from glmlab.serve import direct, observe
from glmlab.serve.errors import RequestError, error_body
from glmlab.serve.limits import HttpLimits

# not forwarded either way (RFC 9110 7.6.1), plus what aiohttp recomputes
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                        "host", "content-length"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (method, path, factory(front) -> handler): routes served here instead of passed to the router.
# /metrics (Prometheus, aggregated over the workers) belongs here.
EXTRA_ROUTES: list[tuple[str, str, Callable[[Front], Handler]]] = [*observe.ROUTES]


class _ClientGone(Exception):
    """The client stopped reading (send timeout) or closed the connection mid-stream."""


def json_error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, param), status=status)


def sse_event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def worker_row(name: str, role: str, url: str, info: dict) -> dict:
    """One worker's row of ``/server_info`` from its own ``/server_info``: pages and state slots
    held by requests (not the radix cache's evictable ones), transfers not finished."""
    s = info["internal_states"][0]
    pending = (s.get("transfers_in_flight", 0) + s.get("transfers_waiting", 0)
               + s.get("quarantined_requests", 0))
    return {"name": name, "role": role, "url": url, "running": s["num_running_reqs"],
            "waiting": s["num_queue_reqs"], "parked": s["num_parked_reqs"],
            "used_pages": s["pages_used"] - s["pages_evictable"],
            "used_state_slots": s["state_slots_used"] - s["state_checkpoints"],
            "pending_transfers": pending, "cached_pages": s["pages_tree"],
            "evictable_pages": s["pages_evictable"], "open_requests": s["num_pending_requests"],
            "leak_check": info.get("leak_check")}


class Front:
    """Serves ``host:port`` from its own event loop thread. ``service`` is the supervisor's
    ``Service``: ``health()``, ``recent_deaths()``, ``components()``, ``workers()``."""

    def __init__(self, service, host: str, port: int, upstream: str, limits: HttpLimits,
                 request_timeout_s: float):
        self.service, self.host, self.port, self.upstream = service, host, port, upstream
        self.limits, self.request_timeout_s = limits, request_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="glmlab-front", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"the front cannot serve {self.host}:{self.port}: "
                               f"{self._error}") from self._error

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._open())
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._close())
        self._loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _open(self) -> None:
        # no keep-alive to the router: a pooled connection to a router that just died fails
        # like one it broke mid-request; a fresh one fails to connect (503, not 502). The
        # total timeout is a last resort: the router's --request-timeout-secs answers first.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True), trust_env=False,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self.request_timeout_s + 30, sock_connect=5))
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/server_info", self.server_info)
        for method, path, factory in EXTRA_ROUTES:
            app.router.add_route(method, path, factory(self))
        app.router.add_route("*", "/{tail:.*}", self.proxy)
        # handler_cancellation: a client that goes away cancels its handler, which closes the
        # upstream connection, which is how the router and the workers learn of it
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.session is not None:
            await self.session.close()

    # the service's own routes --------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        ok, why = self.service.health()
        if ok:
            return web.json_response({"status": "ok"})
        return json_error(503, f"glmlab serve is unhealthy: {why}")

    async def server_info(self, _request: web.Request) -> web.Response:
        ok, why = self.service.health()
        rows = await asyncio.gather(*(self._worker(c.name, c.role, c.url)
                                      for c in self.service.workers()))
        return web.json_response({"status": "ok" if ok else "unhealthy",
                                  "problem": None if ok else why,
                                  "components": self.service.components(), "workers": rows})

    async def _worker(self, name: str, role: str, url: str) -> dict:
        try:
            async with self.session.get(f"{url}/server_info",
                                        timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status == 200:
                    return worker_row(name, role, url, await r.json())
                error = f"HTTP {r.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"
        return {"name": name, "role": role, "url": url, "error": error}

    # everything else: the router -----------------------------------------------------------
    async def proxy(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
        except RequestError as e:
            return json_error(e.status, str(e), e.param)
        body = self._with_model(request, body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        hop = "the worker"  # what the router refuses or mangles goes to the workers (direct.py)
        try:
            upstream = await direct.open_direct(self, request, body, headers)
            if upstream is None:
                hop = "the service's router"
                upstream = await self.session.request(
                    request.method, self.upstream + request.rel_url.raw_path_qs,
                    data=body or None, headers=headers)
        except aiohttp.ClientConnectorError as e:  # nothing listens: it is down or restarting
            return json_error(503, await self._explain(f"{hop} is not answering "
                                                       f"({type(e).__name__})"))
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # it took the request, then broke
            return json_error(502, await self._explain(f"{hop} broke off before answering "
                                                       f"({type(e).__name__})"))
        whole = False
        try:
            if upstream.content_type == "text/event-stream":
                return await self._stream(request, upstream)
            try:
                data = await upstream.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                return json_error(502, await self._explain(f"{hop} broke off the answer "
                                                           f"({type(e).__name__})"))
            whole = True
            return await self._answer(upstream, data)
        finally:
            # anything but an answer read whole (a client gone, a stream dropped or broken)
            # closes the connection at once, which aborts the request behind the router
            if whole:
                upstream.release()
            else:
                upstream.close()

    def _with_model(self, request: web.Request, body: bytes) -> bytes:
        """A chat body without ``model`` gets the served model's name, as a worker would take
        it: sglang-router 0.3.2 writes "unknown" there, which no worker serves (a 404 naming a
        model the client never sent)."""
        if request.method != "POST" or request.path != "/v1/chat/completions":
            return body
        try:
            data = json.loads(body)
        except ValueError:
            return body  # the worker says what is wrong with it
        if not isinstance(data, dict) or data.get("model") is not None:
            return body
        return json.dumps({**data, "model": self.service.served_model_name}).encode()

    async def _body(self, request: web.Request) -> bytes:
        """The whole body, refused (413) past the cap before more of it is read."""
        self.limits.check_length(request.headers.get("Content-Length"))
        chunks, size = [], 0
        async for chunk in request.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise self.limits.too_large(f"more than {self.limits.max_body_bytes} bytes "
                                            "sent so far")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _answer(self, upstream: aiohttp.ClientResponse, data: bytes) -> web.Response:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        if upstream.status >= 400:
            data = await self._error_json(upstream.status, data)
            headers["Content-Type"] = "application/json"
        return web.Response(status=upstream.status, body=data, headers=headers)

    async def _error_json(self, status: int, data: bytes) -> bytes:
        """The router's error answer in the service's one error shape, for a 5xx with what the
        supervisor knows (a child that died) added to the message."""
        text = data.decode(errors="replace").strip()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        err = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(err, dict) and "message" in err:
            body = {"error": {**error_body(status, "")["error"], **err, "code": status}}
        else:
            body = error_body(status, text or f"HTTP {status} from the router")
        if status >= 500:
            body["error"]["message"] = await self._explain(str(body["error"]["message"]))
        return json.dumps(body).encode()

    async def _explain(self, message: str, settle_s: float = 0.5) -> str:
        """``message`` and what the supervisor knows. A dying process closes its sockets a
        moment before it can be reaped, so a break seen here may precede its death being
        known: wait up to ``settle_s`` for a child to be down, else name recent deaths."""
        deadline = self._loop.time() + settle_s
        while True:
            ok, why = self.service.health(refresh=True)
            if not ok or self._loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        trouble = why if not ok else self.service.recent_deaths()
        return f"{message}: {trouble}" if trouble else message

    async def _stream(self, request: web.Request,
                      upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        """Pass SSE through event by event (never half an event, so an error event after a
        break parses); a break upstream ends the stream with an error event and [DONE]."""
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        resp = web.StreamResponse(status=upstream.status, headers=headers)
        await resp.prepare(request)
        pending = b""
        try:
            try:
                async for chunk in upstream.content.iter_any():
                    pending += chunk
                    cut = pending.rfind(b"\n\n") + 2
                    if cut >= 2:
                        await self._send(resp, pending[:cut])
                        pending = pending[cut:]
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                message = await self._explain(f"the stream broke off mid-way "
                                              f"({type(e).__name__})")
                await self._send(resp, sse_event(error_body(502, message)) + b"data: [DONE]\n\n")
            else:
                if pending.strip():
                    await self._send(resp, pending)
            await self._send(resp, None)
        except _ClientGone:
            # drop the client: closing upstream (finally, in proxy) aborts the request
            if request.transport is not None:
                request.transport.abort()
        return resp

    async def _send(self, resp: web.StreamResponse, data: bytes | None) -> None:
        """Write ``data`` (None: end the stream) within the send timeout."""
        try:
            await asyncio.wait_for(resp.write(data) if data is not None else resp.write_eof(),
                                   self.limits.stream_send_timeout_s)
        except (asyncio.TimeoutError, ConnectionError) as e:
            raise _ClientGone from e
