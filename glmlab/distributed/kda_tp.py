"""Split a KDA layer's heads across a tensor-parallel group (the KDA half of TP under CP).

KDA heads are independent: head h reads only its own q/k/v channels, conv channels, gates,
decay and beta, and the output projection sums over heads. A rank can therefore run heads
[r*H/tp, (r+1)*H/tp) over *all* tokens and contribute a partial sum of the output projection;
summing the ranks' partials gives the full layer output. The per-request KDA state (conv inputs,
recurrent state) is split the same way, so a rank's cache is built from ``shard_config``.

The shard is an ordinary ``KDAttention`` with a smaller ``num_heads``: the layer's own code runs it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from glmlab.config import ModelConfig
from glmlab.model.kda import KDAttention

# parameter -> (dim, unit) to slice: "channel" rows are H*K wide, "head" rows are H wide;
# everything not listed (the low-rank f_a/g_a projections, the output norm) is shared by all heads.
_SPLIT = {
    "q_proj.weight": (0, "channel"), "k_proj.weight": (0, "channel"),
    "v_proj.weight": (0, "channel"), "q_conv1d": (0, "channel"), "k_conv1d": (0, "channel"),
    "v_conv1d": (0, "channel"), "f_b_proj.weight": (0, "channel"),
    "g_b_proj.weight": (0, "channel"), "dt_bias": (0, "channel"), "b_proj.weight": (0, "head"),
    "A_log": (0, "head"), "o_proj.weight": (1, "channel"),
}


def shard_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The config a rank's KDA layers and cache are built from: H/tp KDA heads."""
    if cfg.kda.num_heads % tp:
        raise ValueError(f"{cfg.kda.num_heads} KDA heads cannot be split over {tp} ranks")
    return replace(cfg, kda=replace(cfg.kda, num_heads=cfg.kda.num_heads // tp))


def shard_kda(layer: KDAttention, cfg: ModelConfig, rank: int, tp: int) -> KDAttention:
    """A new ``KDAttention`` running only this rank's heads, with copies of their weights."""
    local_cfg = shard_config(cfg, tp)
    with torch.device("meta"):
        shard = KDAttention(local_cfg, layer.layer_idx)
    sizes = {"channel": local_cfg.kda.proj_dim, "head": local_cfg.kda.num_heads}
    for name, p in layer.named_parameters():
        if p.dtype == torch.float8_e4m3fn:
            raise ValueError(f"KDA weight {name} is FP8; head sharding expects plain weights")
        value = p.data
        if name in _SPLIT:
            dim, unit = _SPLIT[name]
            value = value.narrow(dim, rank * sizes[unit], sizes[unit])
        module_name, _, attr = name.rpartition(".")
        owner = shard.get_submodule(module_name) if module_name else shard
        setattr(owner, attr, nn.Parameter(value.clone(), requires_grad=False))
    shard.prefill_op, shard.decode_op = layer.prefill_op, layer.decode_op
    return shard
