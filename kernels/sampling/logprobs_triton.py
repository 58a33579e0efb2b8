"""``ref.logprob_table_ref`` in one read of the logits: the sampler's logprobs table.

Row i of the table is ``[log_softmax(x_i)[tokens[i]], top largest log-softmax values
(descending), their token ids]`` in one float dtype (fp32 below 2**24 tokens, else fp64), for
one copy to the host. The torch version reads the [N, V] logits several times (logsumexp is a
max pass and an exp-sum pass, then a two-stage top-k): with the penalties, ~1.8 ms of a decode
step at 128 x 154,880 on an H200, where one read of the 79 MB is ~20 us. Here:

* stage 1, grid (N, cdiv(V, CHUNK)): a program loads one CHUNK of one row once and writes the
  chunk's max, its sum of exp(x - max), and its top ``top`` as rank keys (below);
* stage 2, grid (N,): merges the chunks' (max, sum) pairs into the row's logsumexp (each sum
  rescaled by exp(chunk max - row max)), takes the top ``top`` of the chunks x top candidates,
  reads ``logits[i, tokens[i]]`` and writes the table row.

CHUNK = 4096: at N = 128 and the real vocabulary that is 38 chunks, 4,864 programs of 8 warps,
a few waves over 132 SMs; the candidates a row merges (38 x 20 at top 20) fit one block.
``top`` is a runtime loop bound and only its power-of-two pad a constexpr, so a server whose
batches ask for 1..20 alternatives compiles each kernel once per pad (6), not once per value.

A rank key is one int64 per element: the fp32 value's bits made order-preserving as a signed
int32 in the high half, ``2**31 - 1 - column`` in the low half. The max key is the largest
value, ties to the lower column, so each of the ``top`` picks is a single max-reduction (then
the picked key is struck out); a chunk's top ``top`` contain the row's top ``top`` that lie in
it, so stage 2 sees every winner. Ties: equal values come out lower column first (-0.0 counts
as 0.0); torch.topk orders ties as it likes, so the two agree exactly on distinct values.
-inf logits (masked tokens) are ordinary values here: a row with fewer than ``top`` finite
entries gets -inf entries, lowest columns first. NaN ranks above everything, as in torch.topk.
``tokens`` must be in [0, V) (not checked: that would be a device sync).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096
MAX_TOP = 64  # the iterative picks are a loop of ``top`` reductions; the API asks <= 20
MAX_CANDIDATES = 1 << 14  # chunks x top merged by one stage-2 block; past it chunks grow

_STRUCK = tl.constexpr(-(2**63))  # below every real key: padding and already-picked entries
_LOW = tl.constexpr(2**31 - 1)


@triton.jit
def _rank_keys(x, cols):
    # flip the magnitude bits of negative floats: signed int32 order is then float order
    bits = x.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    # tensor first: ``constexpr - tensor`` is a constexpr under the interpreter
    return (ordered.to(tl.int64) << 32) - cols.to(tl.int64) + _LOW


@triton.jit
def _key_value(key):
    ordered = (key >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _key_column(key):
    return ((key >> 32) << 32) - key + _LOW


@triton.jit
def _take_top(keys, top, TOP_PAD: tl.constexpr):
    """The ``top`` largest of ``keys``, descending, as a [TOP_PAD] vector (tail: _STRUCK)."""
    slots = tl.arange(0, TOP_PAD)
    picked = tl.full([TOP_PAD], _STRUCK, tl.int64)
    for k in range(top):
        best = tl.max(keys, axis=0)
        picked = tl.where(slots == k, best, picked)
        keys = tl.where(keys == best, _STRUCK, keys)  # keys are unique (the column is in them)
    return picked


@triton.jit
def _chunk_kernel(x_ptr, max_ptr, sum_ptr, key_ptr, V, stride_x, num_chunks, top,
                  HAS_TOP: tl.constexpr, TOP_PAD: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=float("-inf"))
    most = tl.max(x, axis=0)
    # an all -inf chunk: shift by 0 so its sum is 0, not exp(-inf + inf) = NaN
    shift = tl.where(most == float("-inf"), 0.0, most)
    part = row * num_chunks + chunk
    tl.store(max_ptr + part, most)
    tl.store(sum_ptr + part, tl.sum(tl.exp(x - shift), axis=0))
    if HAS_TOP:
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 ties with 0.0, as in torch's comparisons
        keys = tl.where(ok, _rank_keys(x, cols), _STRUCK)
        slots = tl.arange(0, TOP_PAD)
        tl.store(key_ptr + part * top + slots, _take_top(keys, top, TOP_PAD), mask=slots < top)


@triton.jit
def _merge_kernel(x_ptr, tok_ptr, max_ptr, sum_ptr, key_ptr, out_ptr, stride_x, num_chunks,
                  top, HAS_TOP: tl.constexpr, TOP_PAD: tl.constexpr, CHUNKS_PAD: tl.constexpr,
                  CANDIDATES_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, CHUNKS_PAD)
    okc = c < num_chunks
    most = tl.load(max_ptr + row * num_chunks + c, mask=okc, other=float("-inf"))
    sums = tl.load(sum_ptr + row * num_chunks + c, mask=okc, other=0.0)
    row_max = tl.max(most, axis=0)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    # an all -inf row: log(0) = -inf, as torch.logsumexp gives
    lse = shift + tl.log(tl.sum(sums * tl.exp(most - shift), axis=0))
    width = 1 + 2 * top
    out_row = out_ptr + row * width
    dtype = out_ptr.dtype.element_ty
    token = tl.load(tok_ptr + row)
    tl.store(out_row, (tl.load(x_ptr + row * stride_x + token) - lse).to(dtype))
    if HAS_TOP:
        j = tl.arange(0, CANDIDATES_PAD)
        keys = tl.load(key_ptr + row * num_chunks * top + j, mask=j < num_chunks * top,
                       other=_STRUCK)
        picked = _take_top(keys, top, TOP_PAD)
        slots = tl.arange(0, TOP_PAD)
        ok = slots < top
        tl.store(out_row + 1 + slots, (_key_value(picked) - lse).to(dtype), mask=ok)
        tl.store(out_row + 1 + top + slots, _key_column(picked).to(dtype), mask=ok)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(n, 1))


def logprob_table_triton(logits: torch.Tensor, tokens: torch.Tensor, top: int,
                         chunk: int = CHUNK) -> torch.Tensor:
    """``ref.logprob_table_ref``: [N, 1 + 2 * top] on the device, from fp32 ``logits`` [N, V]
    and int64 ``tokens`` [N] (``top`` in [0, min(64, V)]; ``chunk`` a power of two, the
    columns one stage-1 program reads)."""
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be 2-D fp32, got {tuple(logits.shape)} {logits.dtype}")
    n, vocab = logits.shape
    if tokens.shape != (n,) or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be int64 [{n}], got {tuple(tokens.shape)} {tokens.dtype}")
    if tokens.device != logits.device:
        raise ValueError(f"tokens on {tokens.device}, logits on {logits.device}")
    if not 0 <= top <= min(MAX_TOP, vocab):
        raise ValueError(f"top must be in [0, {min(MAX_TOP, vocab)}], got {top}")
    if not 0 < vocab < 2**31:
        raise ValueError(f"vocab must be in [1, 2**31), got {vocab}")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    wide = torch.float32 if vocab < (1 << 24) else torch.float64
    out = torch.empty(n, 1 + 2 * top, dtype=wide, device=logits.device)
    if n == 0:
        return out
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    top_pad = _pow2(top)
    # keep stage 2's one block of candidates small: a huge vocabulary gets wider chunks
    while triton.cdiv(vocab, chunk) * top_pad > MAX_CANDIDATES:
        chunk *= 2
    chunks = triton.cdiv(vocab, chunk)
    dev = logits.device
    maxes = torch.empty(n, chunks, dtype=torch.float32, device=dev)
    sums = torch.empty(n, chunks, dtype=torch.float32, device=dev)
    keys = torch.empty(n, chunks * max(top, 1), dtype=torch.int64, device=dev)
    _chunk_kernel[(n, chunks)](logits, maxes, sums, keys, vocab, logits.stride(0), chunks, top,
                               HAS_TOP=top > 0, TOP_PAD=top_pad, CHUNK=chunk,
                               num_warps=8 if chunk >= 4096 else 4)
    _merge_kernel[(n,)](logits, tokens, maxes, sums, keys, out, logits.stride(0), chunks, top,
                        HAS_TOP=top > 0, TOP_PAD=top_pad, CHUNKS_PAD=_pow2(chunks),
                        CANDIDATES_PAD=_pow2(chunks * top_pad), num_warps=4)
    return out
