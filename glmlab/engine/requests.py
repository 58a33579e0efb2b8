"""What makes a request servable by an engine: the checks ``Engine.add_request`` runs once.

Every check raises ``InvalidRequest`` naming the field (the HTTP service turns it into a 400 with
that ``param``): the prompt (empty, token ids outside the vocabulary, no room for one output
token), the length (prompt + ``max_new_tokens`` within the context and the page pool: rejected,
not clamped, as SGLang), token ids in ``stop_token_ids`` and ``logit_bias``, stop strings
without a tokenizer, and prompt logprobs (not with speculation; from a position inside the
prompt). Knows the engine's sizes, not its scheduling.
"""

from __future__ import annotations

from glmlab.core import InvalidRequest, SamplingParams


def check_request(engine, ids: list[int], params: SamplingParams) -> int:
    """``max_len`` (prompt + max_new_tokens) of a request ``engine`` can serve, or raises."""
    if not ids:
        raise InvalidRequest("prompt", "the prompt is empty")
    vocab, context_len = engine.model.cfg.vocab_size, engine.context_len
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequest("prompt", f"token ids must be in [0, {vocab}): {bad[:5]}")
    if len(ids) >= context_len:
        raise InvalidRequest("prompt", f"the prompt has {len(ids)} tokens; the context holds "
                             f"{context_len} (prompt plus at least one output token)")
    if params.stop and engine.tokenizer is None:
        raise InvalidRequest("stop", "stop strings need a tokenizer (this engine has none)")
    max_len = len(ids) + params.max_new_tokens
    if max_len > context_len:  # rejected, not clamped (as SGLang)
        raise InvalidRequest("max_new_tokens", f"the prompt ({len(ids)} tokens) plus "
                             f"max_new_tokens ({params.max_new_tokens}) exceeds the context "
                             f"length ({context_len})")
    pages = engine.cache.pages
    if engine.cache.pages_for(max_len) > pages.capacity:
        raise InvalidRequest("max_new_tokens", f"a request of {max_len} tokens needs more KV "
                             f"pages than the pool holds ({pages.capacity})")
    for name, tokens in (("stop_token_ids", params.stop_token_ids),
                         ("logit_bias", [t for t, _ in params.logit_bias])):
        if any(not 0 <= t < vocab for t in tokens):
            raise InvalidRequest(name, f"token ids must be in [0, {vocab}): "
                                 f"{[t for t in tokens if not 0 <= t < vocab][:5]}")
    if params.prompt_logprobs_from is not None and engine.spec is not None:
        raise InvalidRequest("prompt_logprobs_from", "prompt logprobs (echo, "
                             "logprob_start_len) need speculative decoding off")
    if params.prompt_logprobs_from is not None and params.prompt_logprobs_from >= len(ids):
        raise InvalidRequest("prompt_logprobs_from", f"logprobs from position "
                             f"{params.prompt_logprobs_from} of a {len(ids)}-token prompt")
    return max_len
