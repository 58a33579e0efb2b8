"""Triton indexer (FP8 pooled-key scores + radix top-k) vs the torch references.

On CPU the kernels run under Triton's interpreter (tiny shapes) and are compiled ahead of time for
sm_90 to check they lower to wgmma; on a GPU they run at real widths.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.dsa import indexer_triton as it
from glmlab.kernels.dsa.ref import (
    candidate_mask,
    indexer_scores_fp8_ref,
    quantize_index_queries_ref,
    quantize_pool_keys_ref,
    select_ref,
)
from glmlab.testing.compare import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def indexer_inputs(t, p, hi, di, kpool, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, hi, di, generator=g).to(torch.float16).float()  # kernel dots in fp16
    keys_fp8, key_scale = quantize_pool_keys_ref(torch.randn(p, di, generator=g))
    w = torch.randn(t, hi, generator=g) * hi**-0.5
    pos = torch.randint(0, p * kpool + kpool, (t,), generator=g)
    pos[0], pos[-1] = 0, p * kpool + 1  # no complete pool yet / every pool visible plus a tail
    return [x.to(DEVICE) for x in (q, keys_fp8, key_scale, w, pos)]


def assert_same_selection(out, ref, width_pools):
    for row, (a, b) in enumerate(zip(out.tolist(), ref.tolist(), strict=True)):
        assert sorted(a[:width_pools]) == sorted(b[:width_pools]), f"row {row} pools"
        assert a[width_pools:] == b[width_pools:], f"row {row} tail"


@pytest.mark.parametrize("t,p,hi,di,kpool,topk", [
    pytest.param(5, 24, 2, 16, 4, 4, id="tiny"),
    pytest.param(3, 70, 3, 32, 4, 64, id="more-pools-than-k-in-some-rows"),
    pytest.param(4, 9, 2, 16, 2, 16, id="k-above-pool-count-kpool2"),
])
def test_scores_and_selection_match_reference(t, p, hi, di, kpool, topk):
    q, kf, ks, w, pos = indexer_inputs(t, p, hi, di, kpool)
    scores = it.pool_scores_fp8(q, kf, ks, w, pos, kpool, di**-0.5)
    ref = indexer_scores_fp8_ref(q, kf, ks, w, di**-0.5)
    ok = candidate_mask(pos, p, kpool)
    assert torch.isneginf(scores[~ok]).all()
    assert_close("pool scores", ref[ok], scores[ok], "fp32_chunk")
    out = it.select_topk_tokens(scores, pos, topk, kpool, select_tail=True)
    assert out.shape == (t, topk * kpool + kpool - 1) and out.dtype == torch.int32
    assert_same_selection(out, select_ref(ref, pos, topk, kpool, True), topk * kpool)


def test_ties_at_the_threshold_take_the_lowest_pools():
    scores = torch.tensor([[0.0, 5.0, 0.0, 0.0, 0.0, 2.0, 0.0, float("-inf")]], device=DEVICE)
    out = it.select_topk_tokens(scores, torch.tensor([31], device=DEVICE), 4, 1, False)
    assert out[0].tolist() == [0, 1, 2, 5]  # 5.0, 2.0, then the two lowest-id zeros


def paged_batch(requests, rows_per_request, pages, hi, di, shared_pages, seed=0):
    """Requests whose first ``shared_pages`` pages are one shared prefix (same slots), the rest
    private; pages of the store are shuffled so slot order differs from pool order."""
    g = torch.Generator().manual_seed(seed)
    page = it.PAGE_POOLS
    private = requests * (pages - shared_pages)
    order = torch.randperm(shared_pages + private, generator=g)
    table = torch.empty(requests, pages, dtype=torch.int32)
    table[:, :shared_pages] = order[:shared_pages] * page
    table[:, shared_pages:] = (order[shared_pages:].view(requests, -1) * page).int()
    keys_fp8, key_scale = quantize_pool_keys_ref(torch.randn(order.numel() * page, di,
                                                             generator=g))
    t = requests * rows_per_request
    q = torch.randn(t, hi, di, generator=g)
    w = torch.randn(t, hi, generator=g) * hi**-0.5
    row_req = torch.arange(t) // rows_per_request
    pos = torch.randint(0, pages * page * 4 + 4, (t,), generator=g)
    pos[0] = pages * page * 4 - 1  # every pool visible
    table[-1, -1] = -1  # the last request has one page fewer
    return [x.to(DEVICE) for x in (q, keys_fp8, key_scale, w, pos, table, row_req)]


def paged_reference(q8, qs, keys_fp8, key_scale, w, pos, table, row_req, kpool, scale):
    page = it.PAGE_POOLS
    slots = (table.long()[:, :, None] + torch.arange(page, device=table.device)).flatten(1)
    slots = slots.masked_fill((table < 0).repeat_interleave(page, dim=1), -1)  # missing pages
    q = q8.float() * qs[..., None]  # the kernel's rounding of q, in fp32
    out = []
    for t in range(q.shape[0]):
        s = slots[row_req[t]]
        ref = indexer_scores_fp8_ref(q[t:t + 1], keys_fp8[s.clamp(min=0)],
                                     key_scale[s.clamp(min=0)], w[t:t + 1], scale)[0]
        ok = candidate_mask(pos[t:t + 1], s.numel(), kpool)[0] & (s >= 0)
        out.append(ref.masked_fill(~ok, float("-inf")))
    return torch.stack(out)


@pytest.mark.parametrize("kernel", ["mh", "rowblock"])
@pytest.mark.parametrize("requests,rows,pages,shared,heads", [
    pytest.param(3, 5, 2, 1, 2, id="shared-prefix-page-block-spans-requests"),
    pytest.param(2, 3, 2, 0, 2, id="all-private"),
    pytest.param(4, 20, 1, 1, 2, id="one-page-shared-by-all-64-row-block"),
    pytest.param(3, 8, 3, 1, 32, id="verify-blocks-of-one-request-pipelined"),
    pytest.param(2, 11, 2, 0, 32, id="requests-of-11-rows-uniform-and-mixed-blocks"),
    pytest.param(5, 1, 2, 2, 32, id="decode-one-row-per-request-shared-prefix"),
    pytest.param(2, 4, 2, 1, 24, id="heads-not-a-power-of-two-round2-kernel"),
])
def test_paged_fp8_scores_match_reference(requests, rows, pages, shared, heads, kernel):
    q, kf, ks, w, pos, table, row_req = paged_batch(requests, rows, pages, heads, 16, shared)
    q8, qs = it.quantize_index_queries(q)
    fn = it.pool_scores_fp8_paged if kernel == "mh" else it.pool_scores_fp8_paged_rowblock
    scores = fn(q8, qs, kf, ks, w, pos, table, row_req, 4, 16**-0.5)
    if kernel == "mh" and heads == 32:  # the caller's block-size hint changes no score
        again = fn(q8, qs, kf, ks, w, pos, table, row_req, 4, 16**-0.5,
                   rows_per_program=1 if rows == 1 else 2)
        assert torch.equal(torch.isfinite(again), torch.isfinite(scores))
        assert_close("paged fp8 scores, other block size", scores[torch.isfinite(scores)],
                     again[torch.isfinite(again)], "fp32_chunk")
    ref = paged_reference(q8, qs, kf, ks, w, pos, table, row_req, 4, 16**-0.5)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(scores)) and torch.isneginf(scores[~finite]).all()
    assert_close("paged fp8 scores", ref[finite], scores[finite], "fp32_chunk")


def test_paged_program_shape_rules():
    assert it.paged_rows_per_program(32) == 8 and it.paged_rows_per_program(64) == 4
    assert it.paged_pages_per_program(132, 256) == 32  # 132 x 8 programs >= 4 per SM
    assert it.paged_pages_per_program(40, 256) == 16  # 40 x 16 programs
    assert it.paged_pages_per_program(1, 256) == 1 and it.paged_pages_per_program(1, 1) == 1


def test_query_quantiser_round_trips_within_e4m3():
    q = torch.randn(3, 4, 32) * 5
    q[1, 2] = 0  # a zero head stores scale 0
    q8, qs = quantize_index_queries_ref(q)
    assert q8.dtype == torch.float8_e4m3fn and qs[1, 2] == 0
    back = it.dequantize_index_queries(q8, qs)
    assert (back - q).abs().max() <= q.abs().amax(-1, keepdim=True).max() * 2**-3
    assert (back[1, 2] == 0).all()


@pytest.mark.parametrize("p", [16385, 5000], ids=["streaming-kernel", "register-kernel"])
def test_both_topk_kernels_agree_with_reference(p):
    if p > it.REGISTER_ROW_MAX and DEVICE == "cpu":
        pytest.skip("the streaming kernel's 34 passes over 16K pools are slow in the interpreter")
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(2, p, generator=g).round(decimals=1).to(DEVICE)  # many ties
    pos = torch.tensor([p * 4 + 1, p * 2], device=DEVICE)
    scores[1, p // 2:] = float("-inf")
    out = it.select_topk_tokens(scores, pos, 64, 4, True)
    assert_same_selection(out, select_ref(scores, pos, 64, 4, True), 64 * 4)


def test_no_candidates_and_empty_batch():
    scores = torch.full((2, 6), float("-inf"), device=DEVICE)
    out = it.select_topk_tokens(scores, torch.tensor([1, 2], device=DEVICE), 3, 4, True)
    assert out[:, :12].eq(-1).all() and out[:, 12:].tolist() == [[0, 1, -1], [0, 1, 2]]
    assert it.select_topk_tokens(scores[:0], torch.tensor([], device=DEVICE), 3, 4, True).shape \
        == (0, 15)


_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from glmlab.kernels.dsa import indexer_triton as it
sig = {"q_ptr": "*bf16", "k_ptr": "*fp8e4nv", "ks_ptr": "*fp32", "w_ptr": "*fp32",
       "pos_ptr": "*i32", "out_ptr": "*fp32", "T": "i32", "P": "i32", "stride_qt": "i32",
       "stride_qh": "i32", "stride_wt": "i32", "stride_ot": "i32", "softmax_scale": "fp32",
       "HI": "constexpr", "DI": "constexpr", "KPOOL": "constexpr", "BT": "constexpr",
       "BP": "constexpr"}
src = ASTSource(it._pool_scores_kernel, sig,
                constexprs={"HI": 32, "DI": 128, "KPOOL": 4, "BT": 64, "BP": 64})
scores = triton.compile(src, target=GPUTarget("cuda", 90, 32))
sig = {"score_ptr": "*fp32", "pos_ptr": "*i32", "out_ptr": "*i32", "P": "i32",
       "stride_s": "i32", "stride_o": "i32", "K": "constexpr", "KPOOL": "constexpr",
       "TAIL": "constexpr", "BP": "constexpr"}
src = ASTSource(it._select_kernel, sig, constexprs={"K": 512, "KPOOL": 4, "TAIL": True, "BP": 256})
select = triton.compile(src, target=GPUTarget("cuda", 90, 32))
print("wgmma" if "wgmma.mma_async" in scores.asm["ptx"] else "no-wgmma",
      len(scores.asm["cubin"]) > 0 and len(select.asm["cubin"]) > 0)
"""


def test_compiles_for_sm90_with_wgmma():
    """Ahead-of-time compile for Hopper without a GPU (docs/platform.md section 2.1), in a process
    without the interpreter switch: the 64-row score dot lowers to wgmma."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2:] == ["wgmma", "True"], res.stdout


_AOT_PAGED = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from glmlab.kernels.dsa import indexer_triton as it
sig = {"q_ptr": "*fp8e4nv", "qs_ptr": "*fp32", "k_ptr": "*fp8e4nv", "ks_ptr": "*fp32",
       "w_ptr": "*fp32", "pos_ptr": "*i32", "req_ptr": "*i32", "pt_ptr": "*i32",
       "out_ptr": "*fp32", "T": "i32", "P": "i32", "NP": "i32", "stride_pt": "i32",
       "stride_ot": "i32", "softmax_scale": "fp32", "HI": "constexpr", "DI": "constexpr",
       "KPOOL": "constexpr", "G": "constexpr", "PAGE": "constexpr", "PAGES": "constexpr"}
uni, mixed = it._paged_scores_uniform_kernel, it._paged_scores_mixed_kernel
for kern, g, warps in ((uni, 8, 8), (mixed, 8, 8), (uni, 1, 4)):
    src = ASTSource(kern, sig, constexprs={"HI": 32, "DI": 128, "KPOOL": 4, "G": g, "PAGE": 64,
                                           "PAGES": 32})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptx = k.asm["ptx"]
    print("wgmma-e4m3" if "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3" in ptx
          else "mma-sync" if "mma.sync.aligned" in ptx else "none",
          "local" if ".local" in ptx else "no-local")
"""


def test_paged_kernels_compile_for_sm90_with_fp8_mma():
    """Ahead of time for Hopper: the 8-row (M = 256) blocks lower to e4m3 wgmma; the one-row
    decode form (M = 32, below wgmma's 64) to mma.sync on keys widened to fp16 (exact); no
    local-memory spills."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _AOT_PAGED], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.split("\n")
    assert lines[:3] == ["wgmma-e4m3 no-local", "wgmma-e4m3 no-local", "mma-sync no-local"], lines


@pytest.mark.gpu
def test_paged_real_width_on_gpu():
    """1056 verify rows of 132 requests over 64K tokens (16384 pools = 256 pages), 32 x 128
    heads; a 192-page shared prefix, private tails; top-512 on the kernel's scores."""
    q, kf, ks, w, pos, table, row_req = paged_batch(132, 8, 256, 32, 128, 192, seed=3)
    pos[:] = 16384 * 4 + 2
    q8, qs = it.quantize_index_queries(q)
    scores = it.pool_scores_fp8_paged(q8, qs, kf, ks, w, pos, table, row_req, 4, 128**-0.5)
    check = torch.tensor([0, 7, 500, 1055], device=DEVICE)
    ref = paged_reference(q8[check], qs[check], kf, ks, w[check], pos[check], table,
                          row_req[check], 4, 128**-0.5)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(scores[check]))
    # NOTE: "fp8_mma", not "fp32_chunk": the reference sums the exact e4m3 x e4m3 products in
    # fp32 (2^-24), while SM90's FP8 MMA keeps ~14 bits in its partial sums (DeepSeek-V3
    # report, section 3.3.2): ~2^-13 relative per 128-deep dot, summed over 32 heads with
    # signed weights. Round 1 measured rel_rms 1.2e-4 here; a wrong page or scale is O(1).
    # (The CPU tests run the interpreter's true fp32 dots and keep "fp32_chunk".)
    assert_close("paged scores", ref[finite], scores[check][finite], "fp8_mma")
    out = it.select_topk_tokens(scores, pos, 512, 4, True)
    assert_same_selection(out[check], select_ref(scores[check], pos[check], 512, 4, True), 2048)


@pytest.mark.gpu
def test_real_width_on_gpu():
    """Verify-sized batch at 64K context: 1024 queries, 16384 pools, 32 x 128 heads, top-512."""
    q, kf, ks, w, pos = indexer_inputs(1024, 16384, 32, 128, 4, seed=5)
    out = it.indexer_select_fp8(q, kf, ks, w, pos, 512, 4, 128**-0.5)
    scores = it.pool_scores_fp8(q, kf, ks, w, pos, 4, 128**-0.5)
    ref = indexer_scores_fp8_ref(q, kf, ks, w, 128**-0.5)
    ok = candidate_mask(pos, 16384, 4)
    assert_close("pool scores", ref[ok], scores[ok], "fp32_chunk")
    assert_same_selection(out, select_ref(scores, pos, 512, 4, True), 512 * 4)
