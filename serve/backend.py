"""What the HTTP layer needs from a worker: the model card, a token stream per request, stats.

``api.py`` is written against this contract only; ``worker.py`` implements it around an Engine
(mixed, prefill or decode role). Keeping it small keeps the HTTP layer testable against the real
worker and free of engine details.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from glmlab.serve.schemas import GenRequest
from glmlab.tokenizer import Tokenizer


class ServeError(RuntimeError):
    """A request that failed inside the worker; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelCard:
    served_model_name: str
    model_dir: Path
    context_len: int  # prompt + output tokens one request may reach
    vocab_size: int
    tokenizer: Tokenizer
    role: str
    model_type: str = "glm5_next"
    architectures: tuple[str, ...] = ("Glm5NextForConditionalGeneration",)

    def accepts(self, name: str | None) -> bool:
        return name in (None, "", self.served_model_name, str(self.model_dir), "default")


@dataclass(frozen=True)
class Finish:
    kind: str  # "stop" | "length" | "abort"
    matched: int | str | None = None  # the stop token id or stop string
    message: str = ""

    def to_sglang(self, completion_tokens: int) -> dict:
        if self.kind == "length":
            return {"type": "length", "length": completion_tokens}
        if self.kind == "stop":
            return {"type": "stop", "matched": self.matched}
        return {"type": "abort", "message": self.message}

    @property
    def openai(self) -> str:
        return "length" if self.kind == "length" else "stop"


@dataclass(frozen=True)
class Progress:
    """New output of one request since the previous event."""

    new_ids: tuple[int, ...]
    new_logprobs: tuple[float, ...] | None = None
    cached_tokens: int = 0
    finish: Finish | None = None
    meta: dict = field(default_factory=dict)  # extra meta_info (e.g. the PD transfer record)


class Backend(Protocol):
    card: ModelCard

    def generate(self, req: GenRequest, input_ids: list[int]) -> AsyncIterator[Progress]:
        """Events until one carries ``finish``; raises ServeError on failure. Closing the
        iterator early aborts the request and frees everything it held."""
        ...

    async def flush_cache(self) -> tuple[bool, str]: ...

    def stats(self) -> dict[str, float]:
        """Gauges: num_running_reqs, num_queue_reqs, token_usage, state_usage, ..."""
        ...

    def server_info(self) -> dict: ...

    def trace(self) -> list[dict]:
        """Recent per-request timeline events (PD bootstrap, transfer, first token, finish)."""
        ...
