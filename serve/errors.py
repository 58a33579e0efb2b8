"""The service's two errors and the one JSON shape every error answer has.

``RequestError``: what the client asked cannot be served (HTTP 400, or 404 for an unknown model);
``ServeError``: a request failed inside a worker (a transfer, a dead prefill, the engine thread).
The engine's own ``InvalidRequest`` (bad prompt ids, context, sampling values) answers 400 too,
naming its field as ``param``. Shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


class RequestError(ValueError):
    """A request that is well-formed JSON but cannot be served as asked (HTTP 400 or 404)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


class ServeError(RuntimeError):
    """A request that failed inside the worker; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)
