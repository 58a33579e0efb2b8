"""The MTP layer (layers.{L}) against a direct computation from docs/model.md section 2.8.

transformers does not implement MTP, so the oracle here is the formula itself, written with raw
tensors read straight from the safetensors file (none of glmlab's module code is reused):

  x = eh_proj([RMSNorm_e(embed(tok_{t+1})) ; RMSNorm_h(h_t)])
  x = x + MLA(RMSNorm_in(x))            (dense causal: prompts shorter than index_topk)
  x = x + MoE(RMSNorm_post(x))          (sigmoid router, bias for selection only, x2.5, + shared)
  logits = lm_head(RMSNorm_shared_head(x))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from glmlab import presets
from glmlab.checkpoint.loader import load_model
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids


def _rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _swiglu(x, g, u, d, limit=10.0):
    return (F.silu((x @ g.T).clamp(max=limit)) * (x @ u.T).clamp(-limit, limit)) @ d.T


def _direct_mtp(t: dict, cfg, h: torch.Tensor, next_ids: list[int]) -> torch.Tensor:
    L = cfg.mtp_layer
    p = f"model.language_model.layers.{L}."
    w = {k[len(p) :]: v.float() for k, v in t.items() if k.startswith(p)}
    emb = t["model.language_model.embed_tokens.weight"].float()[next_ids]
    x = (
        torch.cat([_rms(emb, w["enorm.weight"]), _rms(h, w["hnorm.weight"])], -1)
        @ w["eh_proj.weight"].T
    )
    # MLA, expanded (not absorbed), dense causal
    d = cfg.dsa
    a = _rms(x, w["input_layernorm.weight"])
    q = (
        _rms(a @ w["self_attn.q_a_proj.weight"].T, w["self_attn.q_a_layernorm.weight"])
        @ w["self_attn.q_b_proj.weight"].T
    ).view(-1, d.num_heads, d.qk_nope_head_dim)
    c = _rms(a @ w["self_attn.kv_a_proj_with_mqa.weight"].T, w["self_attn.kv_a_layernorm.weight"])
    kv = (c @ w["self_attn.kv_b_proj.weight"].T).view(
        -1, d.num_heads, d.qk_nope_head_dim + d.v_head_dim
    )
    k, v = kv[..., : d.qk_nope_head_dim], kv[..., d.qk_nope_head_dim :]
    s = torch.einsum("thd,shd->hts", q, k) / d.qk_nope_head_dim**0.5
    n = x.shape[0]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(n, -1)
    x = x + o @ w["self_attn.o_proj.weight"].T
    # MoE, token by token
    m = _rms(x, w["post_attention_layernorm.weight"])
    out = torch.zeros_like(m)
    for i in range(n):
        sc = torch.sigmoid(m[i] @ w["mlp.gate.weight"].T)
        top = torch.topk(sc + w["mlp.gate.e_score_correction_bias"], cfg.moe.top_k).indices
        wt = sc[top] / sc[top].sum() * cfg.moe.routed_scaling
        for e, we in zip(top.tolist(), wt, strict=True):
            ex = f"mlp.experts.{e}."
            out[i] += (
                we
                * _swiglu(
                    m[i : i + 1],
                    w[ex + "gate_proj.weight"],
                    w[ex + "up_proj.weight"],
                    w[ex + "down_proj.weight"],
                )[0]
            )
    out += _swiglu(
        m,
        w["mlp.shared_experts.gate_proj.weight"],
        w["mlp.shared_experts.up_proj.weight"],
        w["mlp.shared_experts.down_proj.weight"],
    )
    x = x + out
    return _rms(x, w["shared_head.norm.weight"]) @ t["lm_head.weight"].float().T


def test_mtp_matches_direct_formula(tiny_dir):
    cfg = presets.preset_config("tiny")
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    model = load_model(tiny_dir, dtype=torch.float32)
    ids = prompt_ids(14, 8)  # shorter than index_topk: the MTP DSA layer attends densely
    session = Session(model, max_len=32)
    hidden = session.forward({0: ids})[0]  # target final normalised hidden [n, D]
    # position t pairs the target hidden at t with token t+1
    with torch.inference_mode():
        from glmlab.model.plan import ForwardPlan

        plan = ForwardPlan.build(
            [len(ids) - 1], [0], [0], session.page_table[:1], session.page_size
        )
        mtp_h = model.mtp_forward(hidden[:-1], torch.tensor(ids[1:]), plan, session.cache)
        ours = model.logits(mtp_h)
    ref = _direct_mtp(tensors, cfg, hidden[:-1].float(), ids[1:])
    assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
