"""The peers' rows of the MoE benchmark (``glmlab.bench.ops_moe``), on a ``Case``'s inputs.

SGLang 0.5.23's ``fused_moe_kernel`` (its wheel and config tables, ``glmlab.kernels.moe.peers``):
both GEMMs, and the whole MoE with glmlab's align, quantisation and combine around SGLang's up
GEMM, act_and_mul and down GEMM (``sglang_moe``, also what the numerics check runs). torch: per
expert ``torch._scaled_mm`` with block scales, and one ``F.scaled_grouped_mm`` where torch has it.
"""

from __future__ import annotations

import json

import torch

from glmlab.bench.ops_moe_case import Case
from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.moe import peers
from glmlab.kernels.moe.act_triton import combine
from glmlab.kernels.moe.routing_triton import align_pairs


def _pair_order(h8, hs, al, num_pairs):
    """Aligned rows -> pair order (row t*A + a), what SGLang's non-TMA down GEMM reads."""
    n = int(al.num_padded.item())
    pair = al.sorted_ids[:n].long()
    ok = pair < num_pairs
    q = torch.zeros(num_pairs, h8.shape[1], dtype=h8.dtype, device=h8.device)
    s = torch.ones(num_pairs, hs.shape[1], dtype=hs.dtype, device=hs.device)
    q.view(torch.uint8)[pair[ok]] = h8[:n][ok].view(torch.uint8)
    s[pair[ok]] = hs[:n][ok]
    return q, s


def bench_sglang(c: Case, module, tables, source: str):
    p, tag = c.p, dict(config_source=source)
    sg = peers.SGLangMoE(module, *tables, c.m)
    al_up = c.align(sg.up_cfg["BLOCK_SIZE_M"])
    c.gemm_row("up", "sglang", lambda: sg.up(c.xq, c.xs, p.w13, p.w13_scale, c.w, c.ids, al_up),
               "gate_up GEMM (bf16 out" + (", sorted rows)" if sg.down_tma else ")"),
               config=json.dumps(sg.up_cfg | {"USE_TMA": sg.up_tma}), **tag)
    al_dn = c.align(sg.down_cfg["BLOCK_SIZE_M"])
    h8, hs = c.h8(sg.down_cfg["BLOCK_SIZE_M"])
    if not sg.down_tma:
        h8, hs = _pair_order(h8, hs, al_dn, c.ids.numel())
    c.gemm_row("down", "sglang", lambda: sg.down(h8, hs, p.w2, p.w2_scale, c.w, c.ids, al_dn),
               "down GEMM + routing weight (pair rows)",
               config=json.dumps(sg.down_cfg | {"USE_TMA": sg.down_tma}), **tag)
    if sg.up_cfg["BLOCK_SIZE_M"] != sg.down_cfg["BLOCK_SIZE_M"]:
        return  # sglang aligns once, with the up table's BLOCK_SIZE_M
    c.moe_row("sglang", lambda: sglang_moe(c, sg, al_up),
              "glmlab align + quant, sglang up GEMM + act_and_mul(clamp), glmlab quant, "
              "sglang down GEMM, glmlab combine", **tag)


def sglang_moe(c: Case, sg: peers.SGLangMoE, al) -> torch.Tensor:
    p = c.p
    al = align_pairs(c.ids, p.shape.num_experts, al.block_m)
    xq, xs = quant_act_fp8_triton(c.x, 128)
    h = sg.up(xq, xs, p.w13, p.w13_scale, c.w, c.ids, al)
    y8, ys = quant_act_fp8_triton(sg.act(h, c.ids, al, p.limit), 128)
    return combine(sg.down(y8, ys, p.w2, p.w2_scale, c.w, c.ids, al), c.ids,
                   p.shape.num_experts)


def bench_torch(c: Case):
    """Per-expert cuBLASLt block-scaled GEMMs (same recipe) and the grouped block-scaled form."""
    p = c.p
    al = c.align(16)
    n = int(al.num_padded.item())
    pair = al.sorted_ids[:n].long()
    tok = torch.where(pair < c.ids.numel(), pair // c.ids.shape[1], 0)
    a, a_s = c.xq[tok], c.xs[tok]
    experts = al.expert_ids[:n // 16].long()
    counts = torch.bincount(experts, minlength=p.shape.num_experts) * 16
    spans = [(e, int(s), int(s + k)) for e, (s, k) in enumerate(zip(
        (counts.cumsum(0) - counts).tolist(), counts.tolist(), strict=True)) if k]
    h8, hs = c.h8(16)

    def loop(a, a_s, w, w_s):
        return [peers.torch_block_mm(a[s:t], a_s[s:t], w[e], w_s[e]) for e, s, t in spans]

    inc = "per-expert torch._scaled_mm, block scales, rows pre-gathered (16-padded)"
    c.gemm_row("up", "torch_block_loop", lambda: loop(a, a_s, p.w13, p.w13_scale), inc)
    c.gemm_row("down", "torch_block_loop", lambda: loop(h8, hs, p.w2, p.w2_scale), inc)
    offs = counts.cumsum(0).to(torch.int32)
    c.gemm_row("up", "torch_grouped_block", lambda: peers.torch_grouped_block(
        a, a_s, p.w13, p.w13_scale, offs), "F.scaled_grouped_mm, block scales, pre-gathered")
