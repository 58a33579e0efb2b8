"""The MTP (next-n) layer stored as ``layers.{num_layers}``: one plain pre-norm DSA + MoE block.

For position t it combines the target model's final normalised hidden state h_t with the embedding
of token t+1 and predicts token t+2 through the shared lm_head (docs/model.md section 2.8):

  x = eh_proj([RMSNorm_e(embed(tok_{t+1})) ; RMSNorm_h(h_t)])
  x = x + DSA(RMSNorm_in(x));  x = x + MoE(RMSNorm_post(x))
  logits = lm_head(RMSNorm_shared_head(x))

No mHC streams here. Its DSA layer has its own latent/indexer cache (layer index ``num_layers``).
transformers does not implement this layer; tests check it against a direct computation.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.cache.storage import ModelCache
from glmlab.config import ModelConfig
from glmlab.model.dsa import DSAttention
from glmlab.model.layers import Linear, RMSNorm
from glmlab.model.moe import MoE
from glmlab.model.plan import ForwardPlan


class SharedHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MTPLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.enorm, self.hnorm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.eh_proj = Linear(2 * d, d)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.self_attn = DSAttention(cfg, layer_idx=cfg.num_layers)
        self.mlp = MoE(cfg)
        self.shared_head = SharedHead(cfg)

    def forward(
        self,
        target_hidden: torch.Tensor,
        next_embeds: torch.Tensor,
        plan: ForwardPlan,
        cache: ModelCache,
    ) -> torch.Tensor:
        """target_hidden, next_embeds: [T, D] -> normalised MTP hidden [T, D] (feed to lm_head)."""
        x = self.eh_proj(torch.cat([self.enorm(next_embeds), self.hnorm(target_hidden)], dim=-1))
        y = self.self_attn(self.input_layernorm(x), plan, cache)
        h, x = self.post_attention_layernorm.add_forward(y, x)  # x += y; h = norm(x)
        return self.shared_head.norm.add_forward(self.mlp(h), x)[0]
