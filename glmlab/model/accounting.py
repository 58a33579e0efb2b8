"""Parameter counts of a configuration, taken from the model itself (built on the meta device).

Nothing is allocated, so the full 320B-parameter model is counted in milliseconds, and the
numbers are those of the code that runs, not of a separate formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmlab.config import ModelConfig
from glmlab.model.glm import GLM5Model
from glmlab.model.moe import Experts


@dataclass(frozen=True)
class ParamCounts:
    main: int  # everything except the MTP layer (embedding and lm_head included)
    mtp: int  # the MTP layer (it shares embedding and lm_head with the main model)
    routed_experts: int  # routed-expert weights of the main model
    active: int  # main-model weights one token touches: routed experts only top-A of E
    embed: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.main + self.mtp


def param_counts(cfg: ModelConfig) -> ParamCounts:
    with torch.device("meta"):
        model = GLM5Model(cfg, with_mtp=cfg.mtp_layer is not None)
    mtp = sum(p.numel() for p in model.mtp.parameters()) if model.mtp is not None else 0
    main = sum(p.numel() for p in model.parameters()) - mtp
    routed = sum(
        p.numel()
        for name, m in model.named_modules()
        if isinstance(m, Experts) and not name.startswith("mtp.")
        for p in m.parameters()
    )
    active = main - routed + routed * cfg.moe.top_k // cfg.moe.num_experts
    return ParamCounts(
        main=main,
        mtp=mtp,
        routed_experts=routed,
        active=active,
        embed=model.embed_tokens.weight.numel(),
        lm_head=model.lm_head.weight.numel(),
    )


def layer_table(cfg: ModelConfig) -> list[dict]:
    """One row per layer: index, attention family, FFN family (the MTP layer last)."""
    rows = [
        {"layer": i, "attention": t.value, "ffn": f.value}
        for i, (t, f) in enumerate(zip(cfg.layer_types, cfg.ffn_types, strict=True))
    ]
    if cfg.mtp_layer is not None:
        rows.append({"layer": cfg.mtp_layer, "attention": "dsa (mtp)", "ffn": "moe (mtp)"})
    return rows
