"""The DFlash2 draft model's configuration, read from (and written to) its ``config.json``.

Layout of a draft directory's config (HF style; the DFlash-specific part nests under
``dflash_config`` as in sglang):

    {"architectures": ["DFlash2DraftModel"], "model_type": "dflash2",
     "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 192, "vocab_size": 320,
     "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
     "dflash_config": {"block_size": 8, "target_layer_ids": [0, 2], "mask_token": "<|mask|>",
                       "mask_token_id": 268, "selector_rank": 16, "selector_top_k": 8}}

``target_layer_ids`` are the target layers *after* which hidden features are captured (sglang
hooks "before layer id + 1"; the same positions). The mask token may be given by id, or by name and
resolved through the target's tokenizer. Every field is checked on load; a config that cannot drive
the given target fails with a message naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glmlab.config import ModelConfig

MODEL_TYPE = "dflash2"


class DraftConfigError(ValueError):
    """A draft checkpoint that cannot be used as it is; the message names the field or tensor."""


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """sglang's ``build_target_layer_ids``; on targets too shallow for it, evenly spread ids."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    ids = [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    if span <= 0 or len(set(ids)) < len(ids):
        n = min(num_draft_layers, num_target_layers)
        ids = sorted({round(i * (num_target_layers - 1) / max(1, n - 1)) for i in range(n)})
    return tuple(ids)


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    selector_rank: int
    selector_top_k: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0

    def __post_init__(self) -> None:
        positive = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size", "selector_rank", "selector_top_k")
        for name in positive:
            if getattr(self, name) < 1:
                raise DraftConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.block_size < 2:
            raise DraftConfigError(f"block_size must be >= 2 (anchor + drafts): {self.block_size}")
        if self.num_heads % self.num_kv_heads:
            raise DraftConfigError(f"num_attention_heads ({self.num_heads}) must be a multiple of "
                                   f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise DraftConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        ids = self.target_layer_ids
        if not ids or list(ids) != sorted(set(ids)) or ids[0] < 0:
            raise DraftConfigError(f"target_layer_ids must be distinct, ascending, >= 0: {ids}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DraftConfigError(f"mask_token_id {self.mask_token_id} outside the vocab "
                                   f"[0, {self.vocab_size})")
        if self.selector_top_k > self.vocab_size:
            raise DraftConfigError(f"selector_top_k ({self.selector_top_k}) exceeds the vocab")

    @property
    def num_drafts(self) -> int:
        return self.block_size - 1

    def check_target(self, target: ModelConfig) -> None:
        """Raise unless this draft can run on ``target`` (widths, vocab, layer ids)."""
        if self.hidden_size != target.hidden_size:
            raise DraftConfigError(f"draft hidden_size {self.hidden_size} != target hidden_size "
                                   f"{target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            raise DraftConfigError(f"draft vocab_size {self.vocab_size} != target vocab_size "
                                   f"{target.vocab_size} (the draft borrows the target's "
                                   "embedding and lm_head)")
        if self.target_layer_ids[-1] >= target.num_layers:
            raise DraftConfigError(f"target_layer_ids {self.target_layer_ids} name layers beyond "
                                   f"the target's {target.num_layers}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any],
                  resolve_token: Callable[[str], int | None] | None = None) -> DFlashConfig:
        if raw.get("model_type") != MODEL_TYPE:
            raise DraftConfigError(f"model_type must be {MODEL_TYPE!r}, got "
                                   f"{raw.get('model_type')!r}")
        dflash = raw.get("dflash_config")
        if not isinstance(dflash, dict):
            raise DraftConfigError("config.json has no dflash_config section")

        def need(src: dict, key: str, where: str) -> Any:
            if key not in src:
                raise DraftConfigError(f"config.json: {where}{key} is missing")
            return src[key]

        heads = int(need(raw, "num_attention_heads", ""))
        return cls(
            hidden_size=int(need(raw, "hidden_size", "")),
            num_layers=int(need(raw, "num_hidden_layers", "")),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads", heads)),
            head_dim=int(raw.get("head_dim") or int(need(raw, "hidden_size", "")) // heads),
            intermediate_size=int(need(raw, "intermediate_size", "")),
            vocab_size=int(need(raw, "vocab_size", "")),
            block_size=int(dflash.get("block_size", raw.get("block_size", 16))),
            target_layer_ids=tuple(int(i) for i in need(dflash, "target_layer_ids",
                                                        "dflash_config.")),
            mask_token_id=_mask_id(dflash, resolve_token),
            selector_rank=int(need(dflash, "selector_rank", "dflash_config.")),
            selector_top_k=int(need(dflash, "selector_top_k", "dflash_config.")),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 1_000_000.0)),
        )

    def to_dict(self, mask_token: str | None = None) -> dict[str, Any]:
        dflash = {"block_size": self.block_size, "target_layer_ids": list(self.target_layer_ids),
                  "mask_token_id": self.mask_token_id, "selector_rank": self.selector_rank,
                  "selector_top_k": self.selector_top_k}
        if mask_token is not None:
            dflash["mask_token"] = mask_token
        return {"architectures": ["DFlash2DraftModel"], "model_type": MODEL_TYPE,
                "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "dflash_config": dflash}


def _mask_id(dflash: dict, resolve_token: Callable[[str], int | None] | None) -> int:
    if "mask_token_id" in dflash:
        return int(dflash["mask_token_id"])
    name = dflash.get("mask_token")
    if name is None:
        raise DraftConfigError("dflash_config needs mask_token_id or mask_token")
    found = resolve_token(name) if resolve_token else None
    if found is None:
        raise DraftConfigError(f"mask token {name!r} is not in the target tokenizer "
                               "(set dflash_config.mask_token_id)")
    return found
