"""Host cost of structured output per decode step: xgrammar's bitmask fill and token accept for
``--constrained`` requests under the bench's JSON schema (``api.SCHEMA``), timed apart.

The engine fills the masks while the step's forward still runs on the GPU (``BatchSampler``
asks for them before anything waits on the device). Until the accepts were told late, each sampled
token was accepted after the step's tokens reached the host, with the GPU idle until the next step
was launched; this case measured that the accepts dominate (30 us against 7 us per request), and
now the scheduler leaves a token that cannot end the grammar pending and the sampler tells it
before the next fill, overlapping the next forward (``Req.grammar_pending``), which is the part of
SGLang's overlap scheduler that matters here. No model: a walk through the grammar, each matcher
taking its highest allowed token every step.
"""

from __future__ import annotations

import statistics
import time

import torch


def _highest_allowed(row: torch.Tensor) -> int:
    word = int((row != 0).nonzero()[-1])
    bits = int(row[word]) & 0xFFFFFFFF
    return word * 32 + bits.bit_length() - 1


def case_matchers(engine_vocab: int, tokenizer, schema: str, constrained: int,
                  steps: int) -> dict:
    from glmlab.serve.grammar import Compiled, GrammarCache
    from glmlab.serve.schemas import GrammarSpec

    compiled = GrammarCache(tokenizer, engine_vocab).compile(GrammarSpec("json_schema", schema))
    matchers = [Compiled(compiled).matcher() for _ in range(constrained)]
    mask = torch.empty(constrained, (engine_vocab + 31) // 32, dtype=torch.int32)
    fill, accept = [], []
    for _ in range(steps):
        t = time.perf_counter()
        for j, m in enumerate(matchers):
            m.fill_mask(mask, j)
        fill.append(time.perf_counter() - t)
        tokens = [_highest_allowed(mask[j]) for j in range(constrained)]
        t = time.perf_counter()
        for m, tok in zip(matchers, tokens, strict=True):
            if not m.accept(tok):
                raise RuntimeError(f"the grammar refused its own allowed token {tok}")
        accept.append(time.perf_counter() - t)
    return {"case": "matchers", "constrained": constrained, "steps": steps,
            "fill_ms_per_step": round(statistics.median(fill) * 1e3, 4),
            "accept_ms_per_step": round(statistics.median(accept) * 1e3, 4),
            "accept_us_per_request": round(statistics.median(accept) * 1e6 / constrained, 2),
            "fill_us_per_request": round(statistics.median(fill) * 1e6 / constrained, 2)}
