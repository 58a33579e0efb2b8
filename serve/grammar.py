"""Structured output with xgrammar (SGLang's default backend): compile once, match per request.

``GrammarCache.compile_for(batch)`` compiles the batch's constraint (``GrammarSpec``: JSON object,
JSON schema, regex, EBNF, structural tag) in a worker thread, off the event loop and the engine's
step loop (a slow grammar delays only its own request), once per distinct spec: concurrent
requests for the same spec await one compilation. Each request then gets its own
``XgrMatcher`` (``GenRequest.matcher()``), which the engine's sampler asks for a bitmask row of
the allowed next tokens every step and tells each token it emits (``glmlab.core.GrammarMatcher``).

Constrained requests decode without speculation (``Engine._verify_width``): drafts were proposed
from unconstrained distributions, and decoding them plainly keeps the mask exact.

Knows xgrammar and the tokenizer's vocabulary; nothing of the engine or HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from glmlab.serve.errors import RequestError
from glmlab.serve.schemas import GenBatch, GrammarSpec


def _xgr():
    try:
        import xgrammar
    except ImportError as e:  # an extra, like the other serving packages
        raise RequestError("structured output needs xgrammar: pip install 'glmlab[serve]'",
                           status=501) from e
    return xgrammar


class XgrMatcher:
    """One request's position in a compiled grammar."""

    def __init__(self, compiled):
        self._m = _xgr().GrammarMatcher(compiled)
        self.stop_token_ids = frozenset(self._m.stop_token_ids)

    def fill_mask(self, bitmask, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        return self._m.accept_token(token)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()


@dataclasses.dataclass(frozen=True)
class Compiled:
    grammar: object

    def matcher(self) -> XgrMatcher:
        return XgrMatcher(self.grammar)


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._compiler = None
        self._done: dict[GrammarSpec, asyncio.Future] = {}

    def _compiler_for(self):
        if self._compiler is None:
            xgr = _xgr()
            vocab = self.tokenizer._tok.get_vocab(with_added_tokens=True)
            encoded = [""] * self.vocab_size
            for text, i in vocab.items():
                if i < self.vocab_size:
                    encoded[i] = text
            info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL,
                                     vocab_size=self.vocab_size,
                                     stop_token_ids=list(self.tokenizer.eos_token_ids))
            self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def compile(self, spec: GrammarSpec):
        """The compiled grammar of ``spec`` (blocking: run in a thread)."""
        c = self._compiler_for()
        try:
            # no free whitespace: a JSON answer cannot drift into blanks until max_tokens
            if spec.kind == "json_object":
                return c.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "json_schema":
                return c.compile_json_schema(spec.source, any_whitespace=False)
            if spec.kind == "regex":
                return c.compile_regex(spec.source)
            if spec.kind == "ebnf":
                return c.compile_grammar(spec.source)
            json.loads(spec.source)  # a clear error for what is not JSON at all
            return c.compile_structural_tag(spec.source)
        except (RuntimeError, ValueError, TypeError) as e:
            raise RequestError(f"cannot compile the {spec.kind} constraint: "
                               f"{str(e).splitlines()[0][:300]}", param=spec.kind) from e

    async def get(self, spec: GrammarSpec) -> Compiled:
        fut = self._done.get(spec)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._done[spec] = asyncio.ensure_future(
                loop.run_in_executor(None, self.compile, spec))
        try:
            return Compiled(await asyncio.shield(fut))
        except RequestError:
            self._done.pop(spec, None)  # a bad spec is not cached: the next one retries
            raise

    async def compile_for(self, batch: GenBatch) -> GenBatch:
        """``batch`` with each request's grammar compiled (unchanged without one)."""
        if all(r.grammar is None for r in batch.requests):
            return batch
        reqs = []
        for r in batch.requests:
            compiled = None if r.grammar is None else await self.get(r.grammar)
            reqs.append(dataclasses.replace(r, compiled=compiled))
        return dataclasses.replace(batch, requests=tuple(reqs))
