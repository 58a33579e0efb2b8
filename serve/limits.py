"""What one HTTP hop of the service accepts and how long it waits for a client (front and workers).

``HttpLimits`` travels in every ``WorkerConfig`` and configures the service's front (front.py), so
the router's address and each worker's own port refuse the same things the same way:

- a body larger than ``max_body_bytes`` answers 413 before it is read: at once when its
  ``Content-Length`` says so, else as soon as the bytes read pass the cap (chunked uploads);
- a streaming client that accepts no bytes for ``stream_send_timeout_s`` (it stopped reading) is
  dropped and its request aborted, so its pages and state slot return to the pools; the engine
  never waits on a socket either way (records go to an unbounded per-request queue, bounded in
  practice by the request's own ``max_new_tokens``).

This module knows sizes and times only; reading bodies is each server's (its framework differs).
"""

from __future__ import annotations

from dataclasses import dataclass

from glmlab.serve.errors import RequestError


@dataclass(frozen=True)
class HttpLimits:
    # a 200K-token prompt as token ids is ~1.4 MB of JSON; 16 MiB leaves room for chat bodies
    max_body_bytes: int = 16 << 20
    stream_send_timeout_s: float = 30.0  # no byte accepted for this long: the client is gone

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.stream_send_timeout_s <= 0:
            raise ValueError("stream_send_timeout_s must be > 0, got "
                             f"{self.stream_send_timeout_s}")

    def check_length(self, header: str | None) -> None:
        """Refuse a declared ``Content-Length`` over the cap (or not a number) before reading."""
        if header is None:
            return
        try:
            declared = int(header)
        except ValueError:
            raise RequestError(f"Content-Length {header!r} is not a number",
                               param="Content-Length") from None
        if declared > self.max_body_bytes:
            raise self.too_large(f"{declared} bytes")

    def too_large(self, what: str) -> RequestError:
        return RequestError(f"the request body ({what}) is larger than this service accepts "
                            f"({self.max_body_bytes} bytes, --http-max-body-bytes)",
                            status=413, param="body")
