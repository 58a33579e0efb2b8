"""The batched sampler: one token per row of a step's logits, every request's own rules at once.

What ``SamplingParams`` asks is applied to the fp32 logits the forward returns (so nothing here
touches a captured CUDA graph), as tensor ops over the whole batch, in this order:

1. logit adjustments, only for the rows that ask: repetition penalty (prompt and output tokens:
   positive logits divided, negative multiplied), frequency and presence penalties (output
   tokens), ``logit_bias``, stop tokens masked until ``min_new_tokens``; then grammar bitmasks;
2. greedy rows: argmax; the others: temperature, top-k, top-p, min-p (per-row tensors), then a
   draw by the exponential race ``argmax(p / E)``, ``E = -log(u)``, taken in the log domain as
   ``argmax(log p - log E)`` (``kernels/sampling/ref.race_ref``), whose uniforms ``u`` are a
   hash of (request seed, position, token id). Rows that only scale by a temperature race
   ``logits / T`` itself (no softmax: the row's normaliser does not move the argmax), in one
   pass per row with the ``race`` backend. A request's token therefore depends on its seed,
   its position and its distribution only: not on its batch, not on a generator's history, the
   same after preemption, and the n samples of one prompt differ by their seeds alone.
3. logprobs of the sampled tokens and the top-k alternatives, of the *raw* logits (before
   temperature, penalties or masks: what the model said), for the rows that ask.

Per-request state lives in a table with one row per adjusted request (output-token counts,
prompt-token marks, bias, stop mask), filled once from the request's tokens on its first step and
updated with a scatter after each draw; ``release`` frees the row when the request ends.

This module knows torch and ``glmlab.core``; it knows nothing about scheduling or the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from glmlab.core import Req, Sampled, TokenLogprob
from glmlab.kernels.sampling.ref import (
    apply_penalties_ref,
    apply_token_mask_ref,
    logprob_table_ref,
    race_ref,
    seeded_uniform,
)

_MASK = float("-inf")


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a prompt whose first sample has ``seed``."""
    if index == 0:
        return seed
    x = (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) & ((1 << 63) - 1)
    return x ^ (x >> 29)


def filter_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, truncates: bool | None = None,
                 floors: bool | None = None) -> torch.Tensor:
    """softmax(logits / T) restricted by per-row top-k (<= 0: off), top-p and min-p, renormalised.
    The most likely token always survives. ``truncates`` (any row's top-k or top-p cuts) and
    ``floors`` (any row's min-p) when the caller knows them on the host: no device sync here."""
    x = logits / temperature[:, None]
    vocab = x.shape[-1]
    if truncates is None:
        truncates = bool(((top_k > 0) & (top_k < vocab)).any()) or bool((top_p < 1.0).any())
    if floors is None:
        floors = bool((min_p > 0).any())
    if truncates:
        sorted_x, order = x.sort(dim=-1, descending=True)
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
        ranks = torch.arange(vocab, device=x.device)[None, :]
        sorted_x = sorted_x.masked_fill(ranks >= k[:, None], _MASK)
        p = sorted_x.softmax(-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (p.cumsum(-1) - p) >= top_p[:, None]
        sorted_x = sorted_x.masked_fill(drop, _MASK)
        x = torch.full_like(x, _MASK).scatter(-1, order, sorted_x)
    probs = x.softmax(-1)
    if floors:
        floor = probs.max(-1, keepdim=True).values * min_p[:, None]
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class _Extras:
    """Rows of per-request state for requests whose logits are adjusted."""

    def __init__(self, vocab: int, device: torch.device):
        self.vocab, self.device = vocab, device
        self.rows: dict[str, int] = {}
        self.free: list[int] = []
        self._alloc(8)

    def _alloc(self, n: int) -> None:
        v, dev = self.vocab, self.device
        self.counts = torch.zeros(n, v, device=dev)  # output tokens so far
        self.prompt = torch.zeros(n, v, dtype=torch.bool, device=dev)  # prompt tokens
        self.bias = torch.zeros(n, v, device=dev)
        self.stops = torch.zeros(n, v, dtype=torch.bool, device=dev)  # masked before min tokens
        self.free = list(range(n - 1, -1, -1))

    def _grow(self) -> None:
        old = (self.counts, self.prompt, self.bias, self.stops)
        n = old[0].shape[0]
        self._alloc(2 * n)
        for new, was in zip((self.counts, self.prompt, self.bias, self.stops), old, strict=True):
            new[:n] = was
        self.free = list(range(2 * n - 1, n - 1, -1))

    def row(self, req: Req) -> int:
        r = self.rows.get(req.rid)
        if r is not None:
            return r
        if not self.free:
            self._grow()
        r = self.rows[req.rid] = self.free.pop()
        dev, p = self.device, req.params
        for t in (self.counts, self.prompt, self.bias, self.stops):
            t[r] = 0
        ids = torch.tensor(req.token_ids, dtype=torch.long, device=dev)
        self.prompt[r, ids[:req.num_prompt]] = True
        self.counts[r].index_add_(0, ids[req.num_prompt:], torch.ones(len(req.token_ids)
                                                                      - req.num_prompt, device=dev))
        if p.logit_bias:
            tok = torch.tensor([t for t, _ in p.logit_bias], dtype=torch.long, device=dev)
            self.bias[r].index_add_(0, tok, torch.tensor([b for _, b in p.logit_bias],
                                                         device=dev))
        if p.min_new_tokens and req.stop_ids:
            self.stops[r, torch.tensor(sorted(req.stop_ids), dtype=torch.long, device=dev)] = True
        return r

    def release(self, rid: str) -> None:
        r = self.rows.pop(rid, None)
        if r is not None:
            self.free.append(r)


class BatchSampler:
    """The engine's sampler. ``sample(reqs, logits)``: one token per request (row i of fp32
    logits [N, V] is request i's), with logprobs where asked; ``release(rid)`` when one ends."""

    def __init__(self, vocab: int, device: torch.device | str, penalties=None,
                 token_mask=None, race=None, logprobs=None):
        self.vocab, self.device = vocab, torch.device(device)
        self.extras = _Extras(vocab, self.device)
        # in-place adjustments of the penalised and the constrained rows, the race and the
        # logprobs table (glmlab.kernels.sampling; the ModelRunner binds the backend its config
        # names): ``logprobs(logits, tokens, top)`` has the contract of ``logprob_table``
        self.penalties = penalties or apply_penalties_ref
        self.token_mask = token_mask or apply_token_mask_ref
        self.race = race or race_ref
        self.logprobs = logprobs or logprob_table
        self._masks = torch.empty(0, (vocab + 31) // 32, dtype=torch.int32)  # host, reused

    def release(self, rid: str) -> None:
        self.extras.release(rid)

    def adjust(self, reqs: Sequence[Req], logits: torch.Tensor,
               masks: tuple[list[int], torch.Tensor] | None = None) -> torch.Tensor:
        """Penalties, bias, min-token stop masks and grammar bitmasks (``grammar_masks``, filled
        here unless given); a new tensor if any."""
        return self._adjust(reqs, logits, masks)[0]

    def _adjust(self, reqs: Sequence[Req], logits: torch.Tensor,
                masks: tuple[list[int], torch.Tensor] | None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """``adjust``, and the penalised requests' (batch rows, extras rows) on the device, for
        counting the tokens they draw without another host-to-device copy."""
        dev, x, counted = logits.device, logits, None
        if masks is None:
            masks = self.grammar_masks(reqs)
        adj = [i for i, r in enumerate(reqs) if r.params.adjusts_logits]
        if adj:
            x = x.clone()
            e = self.extras
            # one host-to-device copy per dtype (each is a sync), not one per parameter
            idx, rows = _to_device([adj, [e.row(reqs[i]) for i in adj]], torch.long, dev)
            par = [reqs[i].params for i in adj]
            rep, freq, pres, early = _to_device(
                [[p.repetition_penalty for p in par], [p.frequency_penalty for p in par],
                 [p.presence_penalty for p in par],
                 [len(reqs[i].token_ids) - reqs[i].num_prompt < reqs[i].params.min_new_tokens
                  for i in adj]], torch.float32, dev)
            self.penalties(x, idx, rows, e.counts, e.prompt, e.bias, e.stops, rep, freq, pres,
                           early.bool())
            counted = (idx, rows)
        if masks is not None:
            x = x.clone() if x is logits else x
            masked, bitmask = masks
            self.token_mask(x, _to_device(masked, torch.long, dev),
                            bitmask.to(dev, non_blocking=True))
        return x, counted

    def grammar_masks(self, reqs: Sequence[Req]) -> tuple[list[int], torch.Tensor] | None:
        """(the constrained rows, their [M, ceil(V/32)] int32 host bitmask of the tokens each
        one's grammar allows next); None when no request has a grammar. The host buffer is
        pinned on CUDA and reused: its copy to the device is done before the step ends (the
        sampled tokens' copy back waits for it), so the next step may refill it. Each grammar is
        first told the request's last token if the scheduler left it pending (``Req.
        grammar_pending``): that host work, too, now overlaps the forward."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None
        if self._masks.shape[0] < len(rows):
            self._masks = torch.empty(2 * len(rows), self._masks.shape[1], dtype=torch.int32,
                                      pin_memory=self.device.type == "cuda")
        bitmask = self._masks[:len(rows)]
        bitmask.fill_(-1)
        for j, i in enumerate(rows):
            r = reqs[i]
            if r.grammar_pending is not None:  # the last token, told now (Scheduler)
                token, r.grammar_pending = r.grammar_pending, None
                if not r.grammar.accept(token):
                    r.grammar_refused = token
            r.grammar.fill_mask(bitmask, j)
        return rows, bitmask

    def sample(self, reqs: Sequence[Req], logits: torch.Tensor) -> list[Sampled]:
        if not reqs:
            return []
        dev = logits.device
        # the grammars' masks are host work: filled before anything waits on the device (the
        # first small host-to-device copy below does), they overlap the forward still running
        x, counted = self._adjust(reqs, logits, self.grammar_masks(reqs))
        tokens = x.argmax(-1)
        drawn = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if drawn:
            par = [reqs[i].params for i in drawn]
            vocab = x.shape[-1]
            idx, top_k, seeds, pos = _to_device(
                [drawn, [p.top_k for p in par], [reqs[i].seed for i in drawn],
                 [len(reqs[i].token_ids) for i in drawn]], torch.long, dev)
            temp, top_p, min_p = _to_device([[p.temperature for p in par],
                                             [p.top_p for p in par], [p.min_p for p in par]],
                                            torch.float32, dev)
            truncates = any(0 < p.top_k < vocab or p.top_p < 1.0 for p in par)
            floors = any(p.min_p > 0 for p in par)
            if truncates or floors:
                probs = filter_probs(x[idx], temp, top_k, top_p, min_p, truncates, floors)
                tokens[idx] = _race_log_probs(probs, seeds, pos)
            else:
                tokens[idx] = self.race(x, idx, temp, seeds, pos)
        if counted is not None:  # the penalised requests' output counts, on the device
            idx, rows = counted
            self.extras.counts.index_put_((rows, tokens[idx]),
                                          torch.ones(len(rows), device=dev), accumulate=True)
        return self._to_host(reqs, logits, tokens)

    def _to_host(self, reqs: Sequence[Req], logits: torch.Tensor,
                 tokens: torch.Tensor) -> list[Sampled]:
        """The tokens, and the logprobs of the requests that asked, in one device-to-host copy
        (the step's only wait on the device)."""
        wanted = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if not wanted:
            return [Sampled((t,)) for t in tokens.tolist()]
        top = max(reqs[i].params.logprobs for i in wanted)
        sel = None if len(wanted) == len(reqs) else _to_device(wanted, torch.long,
                                                                 logits.device)
        table = self.logprobs(logits if sel is None else logits[sel],
                              tokens if sel is None else tokens[sel], top)
        n = len(reqs)
        host = torch.cat([tokens.to(table.dtype), table.flatten()]).cpu()
        # the records are built from whole columns (one tolist each), not per entry: at 128
        # requests x 20 alternatives this host work is on the step's critical path
        out = [Sampled((t,)) for t in host[:n].long().tolist()]
        rows = host[n:].view(len(wanted), table.shape[1])
        picked = rows[:, 0].tolist()
        values, ids = rows[:, 1:1 + top].tolist(), rows[:, 1 + top:].long().tolist()
        for j, i in enumerate(wanted):
            k = reqs[i].params.logprobs
            top_k = tuple(zip(ids[j][:k], values[j][:k], strict=True))
            lp = TokenLogprob(out[i].tokens[0], picked[j], top_k)
            out[i] = Sampled(out[i].tokens, (lp,))
        return out


def _to_device(columns: list, dtype: torch.dtype, device) -> torch.Tensor:
    """Equal-length host lists as the rows of one ``dtype`` tensor on ``device``: one copy. On
    CUDA from pinned memory, without blocking: a copy from pageable memory holds the host until
    the stream reaches it, that is until the step's forward has finished, which would leave the
    sampler's host work and launches after the forward instead of beside it."""
    host = torch.tensor(columns, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def logprobs_of(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """log-softmax of raw logits [N, V] at ``tokens[i]`` of row i, with ``top`` alternatives:
    one device-to-host copy for all rows."""
    if not len(tokens):
        return []
    ids = torch.tensor(list(tokens), dtype=torch.long, device=logits.device)
    rows = logprob_table(logits, ids, top).tolist()
    return [_token_logprob(t, r, top) for t, r in zip(tokens, rows, strict=True)]


def logprob_table(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> torch.Tensor:
    """[N, 1 + 2 * top] on the device: row i is the log-softmax of ``logits[i]`` at
    ``tokens[i]``, then its ``top`` largest values, then their token ids, in one float dtype
    wide enough to hold the ids exactly (fp32 below 2**24 tokens), for one copy to the host:
    the kernels' reference (``logprob_table_ref``) with the two-stage ``top_k``."""
    return logprob_table_ref(logits, tokens, top, topk=top_k)


def _token_logprob(token: int, row: Sequence[float], top: int) -> TokenLogprob:
    """A ``logprob_table`` row on the host as a ``TokenLogprob``."""
    return TokenLogprob(token, row[0], tuple(zip(map(int, row[1 + top:1 + 2 * top]),
                                                 row[1:1 + top], strict=True)))


# Rows at least this wide take the two-stage top-k: torch's one-pass top-k gives a row to one
# thread block, which at 128 rows of the real 154,880-token vocabulary leaves most SMs idle.
TOP_K_SPLIT_MIN = 1 << 15
TOP_K_BLOCK = 4096


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` of [N, V] (values descending, their column ids), computed for wide
    rows as the top k of each 4,096-column block, then the top k of those candidates: the same
    set (a row's top k are each in their block's top k), over N x V / 4,096 rows of work."""
    n, v = x.shape
    if v < TOP_K_SPLIT_MIN or k > TOP_K_BLOCK // 2:
        return x.topk(k, dim=-1)
    # equal blocks of at most TOP_K_BLOCK columns when some count up to twice the least one
    # divides V (the real vocabulary: 40 x 3,872), so that the rows need no padded copy
    least = -(-v // TOP_K_BLOCK)
    blocks = next((b for b in range(least, 2 * least + 1) if v % b == 0), least)
    width = -(-v // blocks)
    padded = x
    if blocks * width != v:
        padded = torch.full((n, blocks * width), float("-inf"), dtype=x.dtype, device=x.device)
        padded[:, :v] = x
    vals, cols = padded.view(n, blocks, width).topk(k, dim=-1)  # [N, B, k]
    cols = cols + (torch.arange(blocks, device=x.device) * width)[None, :, None]
    values, pick = vals.flatten(1).topk(k, dim=-1)
    return values, cols.flatten(1).gather(1, pick)


def draw(logits: torch.Tensor, params, seed: int, position: int) -> int:
    """One token from fp32 logits [V] by the rule ``BatchSampler`` applies to every row (no
    logit adjustments): what a reference harness (``glmlab.model.session``) samples with."""
    if params.greedy:
        return int(logits.argmax())
    dev = logits.device
    one = lambda v, dtype=None: torch.tensor([v], device=dev, dtype=dtype)  # noqa: E731
    seeds, pos = one(seed, torch.long), one(position, torch.long)
    x, temp = logits[None].float(), one(params.temperature)
    if 0 < params.top_k < logits.shape[-1] or params.top_p < 1.0 or params.min_p > 0:
        probs = filter_probs(x, temp, one(params.top_k), one(params.top_p), one(params.min_p))
        return int(_race_log_probs(probs, seeds, pos)[0])
    return int(race_ref(x, one(0, torch.long), temp, seeds, pos)[0])


def _race_log_probs(probs: torch.Tensor, seeds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The race over filtered probabilities [M, V] (log 0 = -inf: a dropped token never wins)."""
    u = seeded_uniform(seeds, pos, probs.shape[-1])
    return (probs.log() - torch.log(-torch.log(u))).argmax(-1)
