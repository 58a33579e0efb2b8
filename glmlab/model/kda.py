"""KDA layer: Kimi delta attention with a causal short convolution and a gated output norm.

Per token (docs/model.md section 2.4; H heads of K = V channels, P = H*K):
  q, k, v = W_q h, W_k h, W_v h                      -> short causal conv (width W) + SiLU
  q, k    = l2norm per head (q also * K^-0.5)
  g       = lower_bound * sigmoid(exp(A_log) * (W_fb W_fa h + dt_bias))   (log decay, per channel)
  beta    = sigmoid(W_b h)                           (one per head)
  o       = delta-rule recurrence (kernels/kda/ref.py), state carried per request
  y       = W_o [RMSNorm(o_head) * sigmoid(W_gb W_ga h)]

Carried state per request: the last W-1 conv inputs and the H x K x V recurrent state; both live in
``ModelCache`` at the request's state slot. Multi-token steps use the chunked form, single-token
steps the recurrent form (batched over requests); the two agree to fp32 rounding. Everything
between the input and o_proj is the ``kda_step`` backend op: ``reference_step`` here, or on the
triton backend the fused uniform-step path of ``glmlab.model.kda_fast``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmlab.cache.storage import ModelCache
from glmlab.config import ModelConfig
from glmlab.kernels.kda.ref import causal_conv_ref, kda_gate_ref, l2norm
from glmlab.model import torch_ops
from glmlab.model.layers import Linear, merge_linears
from glmlab.model.plan import ForwardPlan


class KDAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        k = cfg.kda
        d, p = cfg.hidden_size, k.proj_dim
        self.layer_idx, self.cfg = layer_idx, k
        self.eps = cfg.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj = Linear(d, p), Linear(d, p), Linear(d, p)
        self.q_conv1d = nn.Parameter(torch.empty(p, 1, k.conv_kernel))
        self.k_conv1d = nn.Parameter(torch.empty(p, 1, k.conv_kernel))
        self.v_conv1d = nn.Parameter(torch.empty(p, 1, k.conv_kernel))
        self.f_a_proj, self.f_b_proj = Linear(d, k.head_dim), Linear(k.head_dim, p)
        self.g_a_proj, self.g_b_proj = Linear(d, k.head_dim), Linear(k.head_dim, p)
        self.b_proj = Linear(d, k.num_heads)
        self.dt_bias = nn.Parameter(torch.empty(p))
        self.A_log = nn.Parameter(torch.empty(k.num_heads))
        self.o_norm = nn.Parameter(torch.ones(k.head_dim))
        self.o_proj = Linear(p, d)
        self.prefill_op, self.decode_op = torch_ops.kda_prefill, torch_ops.kda_decode
        self.step = torch_ops.kda_step  # the ``kda_step`` backend op
        self.qkv_proj = self.gate_in_proj = None  # set by fuse_projections
        self.fast_conv_weight: torch.Tensor | None = None  # set by prepare_step(fast=True)

    def conv_weight(self) -> torch.Tensor:
        """[3P, W] fp32: conv weights are applied in fp32 whatever the activation dtype."""
        w = torch.cat([self.q_conv1d, self.k_conv1d, self.v_conv1d], dim=0)
        return w.squeeze(1).float()

    def fuse_projections(self) -> None:
        """q|k|v and f_a|g_a|b (each group shares the input h) as one GEMM each; the parts become
        views of the merged weights. Not submodules: their weights are the parts' storage."""
        if self.qkv_proj is None:
            self.__dict__["qkv_proj"] = merge_linears([self.q_proj, self.k_proj, self.v_proj])
            self.__dict__["gate_in_proj"] = merge_linears([self.f_a_proj, self.g_a_proj,
                                                           self.b_proj])
        for merged, part in ((self.qkv_proj, self.q_proj), (self.gate_in_proj, self.f_a_proj)):
            if merged is not None:
                merged.fp8_op = part.fp8_op

    def unfuse_projections(self) -> None:
        self.__dict__["qkv_proj"] = self.__dict__["gate_in_proj"] = None

    def prepare_step(self, fast: bool) -> None:
        """Derived weights the fused step reads every call, computed once."""
        self.fast_conv_weight = self.conv_weight().contiguous() if fast else None

    def projections(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """qkv [T, 3P], f_a [T, K], g_a [T, K], b [T, H] (column slices of fused GEMMs if fused)."""
        k = self.cfg
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(h)
        else:
            qkv = torch.cat([self.q_proj(h), self.k_proj(h), self.v_proj(h)], dim=-1)
        if self.gate_in_proj is not None:
            fa, ga, b = self.gate_in_proj(h).split([k.head_dim, k.head_dim, k.num_heads], -1)
        else:
            fa, ga, b = self.f_a_proj(h), self.g_a_proj(h), self.b_proj(h)
        return qkv, fa, ga, b

    def forward(self, h: torch.Tensor, plan: ForwardPlan, cache: ModelCache) -> torch.Tensor:
        return self.o_proj(self.step(self, h, plan, cache))

    def reference_step(self, h: torch.Tensor, plan: ForwardPlan, cache: ModelCache
                       ) -> torch.Tensor:
        """Everything between the layer input and o_proj, per sequence where it must be: [T, P]."""
        k = self.cfg
        qkv, fa, ga, b = self.projections(h)  # [T, 3P], ...
        g = kda_gate_ref(self.f_b_proj(fa), self.A_log, self.dt_bias,
                         k.lower_bound)  # [T, H, K] fp32
        beta = torch.sigmoid(b)  # [T, H]
        layer, slots, verify = self.layer_idx, plan.state_slots, plan.verify
        if verify is not None:  # speculative verify: keep the inputs a commit rolls back to
            verify.record_conv(layer, slots, cache.conv[layer][slots], qkv)
        if plan.is_decode:
            y = self._conv_decode(qkv, slots, cache)
        else:
            y = torch.cat([self._conv_prefill(qkv[s:e], slots[i], cache)
                           for i, (s, e) in enumerate(plan.token_ranges())])
        q, kk, v = self._split_heads(y)
        states = cache.recurrent[layer][slots].float()
        if verify is not None:  # outputs for the window; the committed state stays as it is
            out, states = verify.kda_recurrence(layer, slots, q, kk, v, g, beta, states)
        elif plan.is_decode:
            out, states = self.decode_op(q, kk, v, g, beta, states)
        else:
            out, states = self.prefill_op(q, kk, v, g, beta, states, plan.cu_seqlens)
        cache.recurrent[layer][slots] = states.to(cache.recurrent[layer].dtype)
        gate = self.g_b_proj(ga).unflatten(-1, (k.num_heads, k.head_dim))
        return self._gated_norm(out.to(h.dtype), gate).flatten(1)

    def _split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        k = self.cfg
        q, kk, v = (t.unflatten(-1, (k.num_heads, k.head_dim)) for t in qkv.chunk(3, dim=-1))
        return l2norm(q.float()) * k.head_dim**-0.5, l2norm(kk.float()), v

    def _conv_prefill(self, qkv, slot, cache):
        conv = cache.conv[self.layer_idx]
        y, state = causal_conv_ref(qkv, self.conv_weight(), conv[slot])
        conv[slot] = state.to(conv.dtype)
        return y

    def _conv_decode(self, qkv, slots, cache):
        """One step for N sequences at once: the window is the W-1 held inputs plus the new one."""
        conv = cache.conv[self.layer_idx]
        window = torch.cat([conv[slots].to(qkv.dtype), qkv[:, :, None]], dim=-1)  # [N, C, W]
        y = F.silu((window.float() * self.conv_weight()).sum(-1)).to(qkv.dtype)
        conv[slots] = window[:, :, 1:].to(conv.dtype)
        return y

    def _gated_norm(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """RMSNorm over each head's V channels (shared weight) times sigmoid(gate), in fp32."""
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.o_norm.float() * of * torch.sigmoid(gate.float())).to(o.dtype)
