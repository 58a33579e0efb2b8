"""Parallel samples (``SamplingParams.n``) and prompt logprobs: the two things a step does beyond
one token per request.

Parallel samples: a request with ``n > 1`` prefills once. When its prompt is computed (after the
forward of its last chunk, before sampling), ``fork_lease`` gives each sibling a lease that shares
the prompt's whole KV pages by reference count (read-only, as radix-tree pages are shared), a copy
of the last, partial page (siblings write their own tokens into it) and a copy of the state slot
(recurrent, conv and index-tail state are request-local: the hybrid cache's rule). The siblings
sample their first token from the parent's logits row with their own seeds and decode as
independent requests from then on. When the pools cannot hold a sibling it is queued instead and
computes its prompt itself (the radix tree may still serve it).

Disaggregated, the prompt is still computed once and its pages allocated once per instance: the
prefill role's siblings draw their first token from the parent's row and end (no lease: the
parent's held cache is exported once); the decode role admits ONE import with a state slot per
sample (``HybridCache.acquire(samples=n)``) and, when the content lands, ``fork_imported`` gives
samples 1..n-1 leases sharing its whole pages, with the state copied into their slots.

Prompt logprobs: ``logit_rows`` widens a step's logits to every row of the prefill chunks whose
request asked (``prompt_logprobs_from``), and ``split_rows`` says which rows sample and which
score prompt tokens. The row at position p predicts token p + 1.

This module knows the cache's pools and storage and the request records; not the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from glmlab.cache.hybrid import HybridCache
from glmlab.core import Entry, Phase, Req, SeqCache, sample_rid
from glmlab.sampling import sample_seed


def copy_page(cache: HybridCache, src: int, dst: int) -> None:
    """Every token-addressed and pool-addressed row of page ``src`` into page ``dst``."""
    storage = cache.storage
    s, kpool = storage.page_size, storage.cfg.dsa.index_kpool
    for tensor, unit in storage.regions().values():
        if unit == "token":
            tensor[dst * s:(dst + 1) * s] = tensor[src * s:(src + 1) * s]
        elif unit == "pool":
            p = s // kpool
            tensor[dst * p:(dst + 1) * p] = tensor[src * p:(src + 1) * p]


def fork_lease(cache: HybridCache, seq: SeqCache, num_tokens: int, reserve_len: int,
               slot: int | None = None) -> SeqCache | None:
    """A lease with the content of ``seq``'s first ``num_tokens`` positions: whole pages shared,
    the partial page and the state slot copied (into ``slot`` when the caller reserved one),
    pages up to ``reserve_len`` allocated; None (nothing taken) when the pools are short."""
    whole, partial = divmod(num_tokens, cache.page_size)
    slots = [slot] if slot is not None else cache._alloc(cache.slots, 1,
                                                         cache._evict_checkpoints)
    if slots is None:
        return None
    shared = list(seq.pages[:whole])
    cache.pages.incref(shared)  # ours now: eviction below cannot take them
    new = cache._alloc(cache.pages, cache.pages_for(reserve_len) - whole, cache._evict)
    if new is None:
        cache.pages.decref(shared)
        if slot is None:
            cache.slots.decref(slots)
        return None
    slot = slots[0]
    dev = cache.storage.device
    cache.storage.copy_state(torch.tensor([seq.slot], device=dev),
                             torch.tensor([slot], device=dev))
    if partial:
        copy_page(cache, seq.pages[whole], new[0])
    return SeqCache(slot, shared + new, seq.prefix_len)


def wants_prompt_logprobs(e: Entry) -> bool:
    p = e.req.params.prompt_logprobs_from
    return (p is not None and e.phase is Phase.PREFILL and not e.req.output_ids
            and e.start + e.num_tokens > p)


def logit_rows(entries: Sequence[Entry]) -> tuple[list[int], list[int]]:
    """(rows of the flat batch whose logits are needed, index into them of each sampling
    entry's row)."""
    rows, sample_at, end = [], [], 0
    for e in entries:
        first = end
        end += e.num_tokens
        if wants_prompt_logprobs(e):
            rows.extend(range(first, end - (1 if e.samples else 0)))
        if e.samples:
            sample_at.append(len(rows))
            rows.append(end - 1)
    return rows, sample_at


def score_prompts(entries: Sequence[Entry], logits: torch.Tensor, logprobs_of) -> None:
    """Append each asking request's prompt-token logprobs from this step's rows (``logits`` in
    the order of ``logit_rows``)."""
    at = 0
    for e in entries:
        if not wants_prompt_logprobs(e):
            at += 1 if e.samples else 0
            continue
        req, start, first = e.req, e.start, req_from(e.req)
        n = e.num_tokens - (1 if e.samples else 0)
        if start == 0 and first == 0:
            req.prompt_logprobs.append(None)  # the first token: nothing precedes it
        # rows at positions start .. start+n-1 predict tokens start+1 .. start+n
        keep = [i for i in range(n) if start + 1 + i >= first]
        if keep:
            rows = torch.tensor([at + i for i in keep], device=logits.device)
            targets = [req.token_ids[start + 1 + i] for i in keep]
            req.prompt_logprobs.extend(logprobs_of(logits[rows], targets,
                                                   req.params.logprobs or 0))
        at += n + (1 if e.samples else 0)


def req_from(req: Req) -> int:
    return req.params.prompt_logprobs_from or 0


def fork_siblings(cache: HybridCache, reqs: Sequence[Req]
                  ) -> tuple[list[tuple[Req, Req]], list[Req]]:
    """For each request done prefilling with ``n > 1`` and not forked yet: (parent, sibling)
    pairs with forked leases, and the siblings the pools could not hold (to be queued). A
    prefill-role parent's siblings get no lease: they only draw their first token from its row
    and end there (the parent's held cache is exported once for all of them)."""
    forked, queued = [], []
    for parent in reqs:
        if parent.params.n == 1 or parent.forked or parent.output_ids:
            continue
        parent.forked = True
        for i in range(1, parent.params.n):
            if parent.hold_after_prefill:
                forked.append((parent, child(parent, i, sample_seed(parent.seed, i), None)))
                continue
            lease = fork_lease(cache, parent.cache, parent.num_prompt, parent.max_len)
            c = child(parent, i, sample_seed(parent.seed, i), lease)
            if lease is None:
                c.prompt_logprobs = []
                queued.append(c)
            else:
                forked.append((parent, c))
    return forked, queued


def fork_imported(cache: HybridCache, parent: Req) -> list[Req]:
    """Samples 1..n-1 of an imported prompt whose content just landed in ``parent``'s lease:
    forked into the state slots reserved at admission, sharing the prompt's whole pages; a
    sample whose pages the pool cannot give has no lease (its reserved slot given back) and
    recomputes its prompt here."""
    parent.forked = True
    out = []
    for i, slot in enumerate(parent.cache.sample_slots, start=1):
        lease = fork_lease(cache, parent.cache, parent.num_prompt, parent.max_len, slot=slot)
        if lease is None:
            cache.slots.decref([slot])
        out.append(child(parent, i, sample_seed(parent.seed, i), lease))
    parent.cache.sample_slots = []
    return out


def siblings(req: Req) -> list[Req]:
    """Samples 1..n-1 of ``req`` as requests that compute their prompt themselves."""
    req.forked = True
    out = [child(req, i, sample_seed(req.seed, i), None) for i in range(1, req.params.n)]
    for c in out:
        c.imported, c.prompt_logprobs = req.imported, []
    return out


def child(parent: Req, index: int, seed: int, cache: SeqCache | None) -> Req:
    """Sample ``index`` of ``parent``'s prompt, with its own seed (and lease, when forked)."""
    c = Req(sample_rid(parent.rid, index), list(parent.prompt_ids), parent.num_prompt,
            parent.params, parent.max_len, parent.stop_ids, generator=None,
            hold_after_prefill=parent.hold_after_prefill, seed=seed, sample_index=index,
            forked=True, grammar=None, prompt_logprobs=list(parent.prompt_logprobs))
    if cache is not None:
        c.cache, c.computed_len, c.cached_tokens = cache, parent.num_prompt, parent.cached_tokens
    return c
