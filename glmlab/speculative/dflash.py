"""DFlash2 block drafting: a small non-causal draft model fed with the target's own features.

Draft model (docs/techniques.md section 1.1): N Qwen3-style pre-norm decoder layers (attention with
per-head q/k RMSNorm and neox RoPE, then a SwiGLU MLP) and a final norm. It has no embedding or
lm_head: it borrows the target's.

- Context: for every committed position the target's hidden features after ``target_layer_ids``
  (stream means of the mHC streams) are concatenated, projected ``ctx = hidden_norm(fc(.))`` and
  turned into each draft layer's K/V (``k = RoPE(k_norm(W_k ctx))``, ``v = W_v ctx``), written to
  the ``DraftKVStore`` at the target's token slot. No draft forward ever runs over context tokens.
- Block: ``[anchor, MASK x (B-1)]`` at positions n .. n+B-1 attends to all context K/V and,
  non-causally, to the whole block. The hidden states of the B-1 mask slots go through the target's
  lm_head; the ``CandidateSelector`` turns them into B-1 drafts in one forward.
- After verification the committed window positions are projected into draft KV the same way
  (``extend``); there is no draft-extend forward.

Attention over the context has two implementations, chosen once per draft model
(``DFlashDraftModel.use_attention``; ``DFlashDrafter`` picks "triton" when the target runs its
fast backends): "torch" gathers each request's context K/V from the store and runs
``scaled_dot_product_attention`` in the model dtype with fp32 softmax (the reference);
"triton" (``glmlab.kernels.dflash``) reads the store in place by token slot, flash-decoding
split over the context, and never builds the [N, L, HKV, Dh] copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from glmlab.extras import import_optional
from glmlab.model.glm import GLM5Model
from glmlab.model.layers import Linear, RMSNorm
from glmlab.speculative.dflash_config import DFlashConfig
from glmlab.speculative.draft_kv import DraftKVStore
from glmlab.speculative.selector import CandidateSelector
from glmlab.speculative.types import CacheLayout, Proposal, SpecRequest, TargetStates

CONTEXT_ROWS_PER_CHUNK = 1 << 21  # draft context rows gathered at once (DraftLayer.forward_store)
ATTENTION_IMPLS = ("torch", "triton")


@dataclass(frozen=True)
class DraftContext:
    """Every request's committed context as the draft layers read it, built once per propose
    and shared by all layers. ``slots`` [N, L] int32 token slots, -1 past each request's length
    (holes before it are for the torch path only); ``lens`` [N] int32 on the slots' device (the
    kernel reads them there: no host sync)."""
    slots: torch.Tensor
    lens: torch.Tensor

    @classmethod
    def of(cls, ctx: DraftContext | torch.Tensor) -> DraftContext:
        """A context, or [N, L] slots -1 padded at the end (lengths counted on the device)."""
        if isinstance(ctx, DraftContext):
            return ctx
        return cls(ctx, (ctx >= 0).sum(1, dtype=torch.int32))

    @cached_property
    def valid(self) -> torch.Tensor:
        """[N, L] bool: which slots the torch path's mask lets through."""
        return self.slots >= 0

    @cached_property
    def readable(self) -> torch.Tensor:
        """[N, L] slots with the padding pointed at slot 0 (gathered, then masked out)."""
        return self.slots.clamp(min=0)


def rope_neox(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [..., H, Dh] rotated by positions [...] (first half / second half pairs)."""
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[..., None] * inv  # [..., Dh/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        d, h, hkv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj, self.k_proj = Linear(d, h * dh), Linear(d, hkv * dh)
        self.v_proj, self.o_proj = Linear(d, hkv * dh), Linear(h * dh, d)
        self.q_norm, self.k_norm = RMSNorm(dh, cfg.rms_norm_eps), RMSNorm(dh, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., D] -> k, v [..., HKV, Dh] (k normed and rotated)."""
        c = self.cfg
        heads = (c.num_kv_heads, c.head_dim)
        k = self.k_norm(self.k_proj(x).unflatten(-1, heads))
        return rope_neox(k, positions, c.rope_theta), self.v_proj(x).unflatten(-1, heads)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, ctx_valid: torch.Tensor) -> torch.Tensor:
        """x [N, B, D]; ctx_k, ctx_v [N, L, HKV, Dh]; ctx_valid [N, L] -> [N, B, D]."""
        return self.o_proj(self.attend(x, positions, ctx_k, ctx_v, ctx_valid))

    def block_qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [N, B, D] -> q [N, B, H, Dh], k, v [N, B, HKV, Dh] (q and k normed and rotated)."""
        c = self.cfg
        q = self.q_norm(self.q_proj(x).unflatten(-1, (c.num_heads, c.head_dim)))
        return (rope_neox(q, positions, c.rope_theta), *self.kv(x, positions))

    def attend(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor,
               ctx_v: torch.Tensor, ctx_valid: torch.Tensor) -> torch.Tensor:
        """``forward`` without the output projection: [N, B, H * Dh]."""
        c = self.cfg
        n, b, _ = x.shape
        q, k, v = self.block_qkv(x, positions)
        keys = torch.cat([ctx_k.to(x.dtype), k], dim=1).transpose(1, 2)  # [N, HKV, L+B, Dh]
        vals = torch.cat([ctx_v.to(x.dtype), v], dim=1).transpose(1, 2)
        valid = torch.cat([ctx_valid, ctx_valid.new_ones(n, b)], dim=1)  # block: non-causal
        # grouped-query attention with the G = H / HKV query heads of a KV head folded into the
        # query axis (query head h reads KV head h // G, as enable_gqa would have it): the keys
        # are never repeated G times (at 64K context that copy is G x the context K/V)
        g = c.num_heads // c.num_kv_heads
        qg = q.transpose(1, 2).reshape(n, c.num_kv_heads, g * b, c.head_dim)
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=valid[:, None, None, :])
        return o.view(n, c.num_heads, b, c.head_dim).transpose(1, 2).flatten(2)

    def attend_store(self, x: torch.Tensor, positions: torch.Tensor, kv: DraftKVStore,
                     index: int, ctx: DraftContext) -> torch.Tensor:
        """``attend`` with layer ``index``'s context read in place from ``kv`` by the Triton
        kernel at ``ctx``'s slots and lengths: nothing of size N x L x HKV x Dh is built."""
        kernel = import_optional("glmlab.kernels.dflash.attention_triton")  # triton: an extra
        q, k, v = self.block_qkv(x, positions)
        store_k, store_v, k_scale, v_scale = kv.layer(index)
        scale = self.cfg.head_dim ** -0.5  # scaled_dot_product_attention's default
        o = kernel.draft_attention(q, k, v, store_k, store_v, ctx.slots, ctx.lens, scale,
                                   k_scale, v_scale)
        return o.flatten(2)  # [N, B, H * Dh]


class DraftLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.gate_proj, self.up_proj, self.down_proj = Linear(d, i), Linear(d, i), Linear(i, d)

    def forward(self, x, positions, ctx_k, ctx_v, ctx_valid):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, ctx_valid)
        return self.ffn(x)

    def forward_store(self, x: torch.Tensor, positions: torch.Tensor, kv: DraftKVStore,
                      index: int, ctx: DraftContext | torch.Tensor, rows_per_chunk: int,
                      attention: str = "torch") -> torch.Tensor:
        """``forward`` with layer ``index``'s context K/V read from ``kv`` at ``ctx``'s slots
        (or [N, L] slots, -1 padded). "triton": read in place by the kernel. "torch": gathered a
        few requests at a time: the gathered context of every request at once is N x L x HKV x Dh
        (132 requests at 64K, 2 KV heads of 128: 4.4 GB for K alone), so at most
        ``rows_per_chunk`` context rows are materialised together. Same maths."""
        h, ctx = self.input_layernorm(x), DraftContext.of(ctx)
        if attention == "triton":
            o = self.self_attn.attend_store(h, positions, kv, index, ctx)
            return self.ffn(x + self.self_attn.o_proj(o))
        step = max(1, rows_per_chunk // max(1, ctx.slots.shape[1]))
        parts = []
        for s in range(0, x.shape[0], step):
            k, v = kv.read(index, ctx.readable[s:s + step], x.dtype)
            parts.append(self.self_attn.attend(h[s:s + step], positions[s:s + step], k, v,
                                               ctx.valid[s:s + step]))
        return self.ffn(x + self.self_attn.o_proj(torch.cat(parts)))

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        d = cfg.hidden_size
        self.cfg = cfg
        self.fc = Linear(len(cfg.target_layer_ids) * d, d)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.selector = CandidateSelector(cfg.vocab_size, d, cfg.selector_rank, cfg.selector_top_k)
        self.attention = "torch"  # the context attention's implementation (use_attention)

    def use_attention(self, impl: str) -> DFlashDraftModel:
        """Choose the context attention once: "torch" (gather + SDPA, the reference) or
        "triton" (the slot-reading kernel of glmlab.kernels.dflash)."""
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"draft attention must be one of {ATTENTION_IMPLS}, got {impl!r}")
        self.attention = impl
        return self

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor):
        """features [T, F] captured target features -> per draft layer (k, v) [T, HKV, Dh]."""
        ctx = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        return [layer.self_attn.kv(ctx, positions) for layer in self.layers]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv: DraftKVStore,
                ctx: DraftContext | torch.Tensor) -> torch.Tensor:
        """x [N, B, D] block embeddings; ctx: a ``DraftContext`` or [N, L] token slots (-1
        padded at the end) -> [N, B, D]."""
        ctx = DraftContext.of(ctx)  # once for every layer
        for i, layer in enumerate(self.layers):
            x = layer.forward_store(x, positions, kv, i, ctx, CONTEXT_ROWS_PER_CHUNK,
                                    self.attention)
        return self.norm(x)


class DFlashDrafter:
    """Drives a ``DFlashDraftModel`` over a target model and a cache layout."""

    def __init__(self, target: GLM5Model, draft: DFlashDraftModel, layout: CacheLayout,
                 kv: DraftKVStore):
        draft.cfg.check_target(target.cfg)
        self.target, self.draft, self.layout, self.kv = target, draft, layout, kv
        self.width = draft.cfg.block_size
        self.capture_layers = draft.cfg.target_layer_ids
        # the draft's context attention follows the target: fast backends read the draft KV in
        # place with the Triton kernel, the torch reference gathers it
        draft.use_attention("triton" if target.backends.kda_step == "triton" else "torch")

    @torch.inference_mode()
    def extend(self, reqs: list[SpecRequest], states: TargetStates) -> None:
        """Project the committed positions' target features into draft KV at their slots."""
        device = self.target.embed_tokens.weight.device
        slots = torch.cat([self.layout.token_slots(r.row, p, p + len(t))
                           for r, p, t in zip(reqs, states.positions, states.tokens, strict=True)])
        pos = torch.cat([torch.arange(p, p + len(t), device=device)
                         for p, t in zip(states.positions, states.tokens, strict=True)])
        for i, (k, v) in enumerate(self.draft.context_kv(torch.cat(states.features), pos)):
            self.kv.write(i, slots, k, v)

    @torch.inference_mode()
    def propose(self, reqs: list[SpecRequest]) -> Proposal:
        cfg, device = self.draft.cfg, self.target.embed_tokens.weight.device
        b = cfg.block_size
        anchor = torch.tensor([r.anchor for r in reqs], device=device)
        ids = torch.full((len(reqs), b), cfg.mask_token_id, device=device)
        ids[:, 0] = anchor
        start = torch.tensor([r.committed for r in reqs], device=device)
        positions = start[:, None] + torch.arange(b, device=device)
        hidden = self.draft(self.target.embed_tokens(ids), positions, self.kv,
                            self._context_slots(reqs))
        drafted = hidden[:, 1:]  # the mask slots predict the tokens at their positions
        logits = self.target.logits(drafted)  # [N, B-1, V]
        sel = self.draft.selector
        cand, first, edges = sel.scores(logits, drafted, anchor)
        temps = [r.params.temperature for r in reqs]
        tokens, q_rows = sel.walk(cand, first, edges, temps, [r.generator for r in reqs])
        if all(t <= 0 for t in temps):
            return Proposal(tokens)
        return Proposal(tokens, sel.dense_proposal(cand, q_rows, cfg.vocab_size))

    def _context_slots(self, reqs: list[SpecRequest]) -> DraftContext:
        """The token slots of each request's committed positions ([N, L] int32, -1 padded) and
        their counts ([N] int32, from the host's own lengths): once per propose, for all layers.
        The layout gives one request's slots at a time, hence one copy per request."""
        device = self.target.embed_tokens.weight.device
        lens = [r.committed for r in reqs]
        slots = torch.full((len(reqs), max(lens)), -1, dtype=torch.int32, device=device)
        for i, (r, n) in enumerate(zip(reqs, lens, strict=True)):
            slots[i, :n] = self.layout.token_slots(r.row, 0, n)
        return DraftContext(slots, torch.tensor(lens, dtype=torch.int32, device=device))

    def release(self, reqs: list[SpecRequest]) -> None:
        """Draft KV rows belong to the target's token slots; nothing is held per request."""
