"""The training forward of ``GLM5Model``: [B, T] windows through the serving modules, with losses.

``target_forward`` mirrors ``DecoderLayer.forward`` / ``GLM5Model.forward`` line for line (mHC
sites, norms, dense or MoE FFN over flattened tokens), swapping only the attention call for its
window form (``glmlab.train.attention``). ``mtp_forward`` does the same for the MTP layer.

The MTP layer is trained as the chain drafter uses it (``glmlab.speculative.mtp``): at depth 1 row
r reads (h_r, token r+1) and predicts token r+2; at depth k > 1 row r reads the depth k-1 output
of row r-1 in place of h_r (as chain step k-1 feeds the MTP its own last output), with the same
token and target. Depth 1 has weight ``mtp_weight``, deeper ones ``mtp_chain_weight``.

``training_losses`` returns every term; ``total`` is what the optimiser minimises: next-token
cross entropy + the MTP terms + the indexers' KL (which reaches only indexer parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glmlab.model.dsa import DSAttention
from glmlab.model.glm import GLM5Model
from glmlab.train.attention import dsa_train, kda_train


@dataclass(frozen=True)
class LossWeights:
    mtp_depth: int = 2  # MTP passes per step (0: the MTP layer is not trained)
    mtp_weight: float = 0.3
    mtp_chain_weight: float = 0.15
    indexer_weight: float = 1.0


def _attend(module, h: torch.Tensor, dense: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(module, DSAttention):
        return dsa_train(module, h, dense)
    return kda_train(module, h), None


def target_forward(model: GLM5Model, ids: torch.Tensor, dense: bool = False,
                   capture_layers: tuple[int, ...] = ()):
    """ids [B, T] -> (final normalised hidden [B, T, D], captured stream means, indexer KLs)."""
    cfg = model.cfg
    b, t = ids.shape
    x = model.embed_tokens(ids).flatten(0, 1)  # [BT, D]
    x = x[:, None, :].expand(-1, cfg.mhc.num_streams, -1).contiguous()  # [BT, N, D]
    captured, kls = [], []
    for i, layer in enumerate(model.layers):
        pre, post, comb = layer.hc_attn.coefficients(x)
        u = layer.input_layernorm(layer.hc_attn.collapse(x, pre)).view(b, t, -1)
        y, kl = _attend(layer.self_attn, u, dense)
        x = layer.hc_attn.expand(x, y.flatten(0, 1), post, comb)
        pre, post, comb = layer.hc_ffn.coefficients(x)
        y = layer.mlp(layer.post_attention_layernorm(layer.hc_ffn.collapse(x, pre)))
        x = layer.hc_ffn.expand(x, y, post, comb)
        if kl is not None:
            kls.append(kl)
        if i in capture_layers:
            captured.append(x.mean(dim=1).view(b, t, -1))
    return model.norm(x.mean(dim=1)).view(b, t, -1), captured, kls


def mtp_forward(model: GLM5Model, hidden: torch.Tensor, next_ids: torch.Tensor,
                dense: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [B, T, D] (the target's, or the previous depth's shifted), next_ids [B, T] ->
    (normalised MTP hidden [B, T, D], indexer KL)."""
    m = model.mtp
    if m is None:
        raise ValueError("this model has no MTP layer")
    x = m.eh_proj(torch.cat([m.enorm(model.embed_tokens(next_ids)), m.hnorm(hidden)], dim=-1))
    y, kl = dsa_train(m.self_attn, m.input_layernorm(x), dense)
    x = x + y
    x = x + m.mlp(m.post_attention_layernorm(x).flatten(0, 1)).view_as(x)
    return m.shared_head.norm(x), kl


def _cross_entropy(model: GLM5Model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model.logits(hidden.flatten(0, 1))  # fp32 [BT, V]
    return F.cross_entropy(logits, targets.flatten())


def training_losses(model: GLM5Model, tokens: torch.Tensor, weights: LossWeights,
                    dense: bool = False) -> dict[str, torch.Tensor]:
    """tokens [B, T + 2]: inputs are the first T, the main targets shifted by 1, MTP's by 2."""
    t = tokens.shape[1] - 2
    hidden, _, kls = target_forward(model, tokens[:, :t], dense)
    out = {"lm": _cross_entropy(model, hidden, tokens[:, 1:t + 1])}
    total = out["lm"]
    prev = hidden
    for k in range(1, weights.mtp_depth + 1):
        src = prev if k == 1 else torch.cat([hidden[:, :1], prev[:, :-1]], dim=1)
        prev, kl = mtp_forward(model, src, tokens[:, 1:t + 1], dense)
        kls.append(kl)
        out[f"mtp{k}"] = _cross_entropy(model, prev, tokens[:, 2:t + 2])
        weight = weights.mtp_weight if k == 1 else weights.mtp_chain_weight
        total = total + weight * out[f"mtp{k}"]
    if kls:
        out["indexer_kl"] = torch.stack(kls).mean()
        total = total + weights.indexer_weight * out["indexer_kl"]
    out["total"] = total
    return out
