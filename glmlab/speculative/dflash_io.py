"""DFlash2 draft checkpoints: an HF-style directory (config.json + safetensors), loaded strictly.

Tensor names are the draft model's parameter names (``fc.weight``, ``hidden_norm.weight``,
``layers.{i}.self_attn.q_proj.weight``, ``layers.{i}.gate_proj.weight``, ``norm.weight``,
``selector.pred_codebook``, ``selector.succ_codebook``, ``selector.proj.weight``). Every expected
tensor must be present with its shape; an unknown tensor is an error too (a silently ignored
tensor is a silently different draft). ``write_random_draft`` writes a random draft for any target
(tests, notebooks, cycle-time studies); its shapes default to a Qwen3-like layer at the target's
width (head dim 128 or hidden/4, 4 query heads per KV head, intermediate 3 x hidden).
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from glmlab.checkpoint.store import CheckpointError, TensorStore
from glmlab.checkpoint.tokenizer import TINY_SPECIALS
from glmlab.config import ModelConfig
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.dflash_config import DFlashConfig, DraftConfigError, default_target_layers

MASK_TOKEN = "<|mask|>"


def load_draft(path: str | Path, target: ModelConfig, dtype: torch.dtype = torch.bfloat16,
               device: str | torch.device = "cpu", tokenizer=None) -> DFlashDraftModel:
    """Load a draft directory for ``target``; ``tokenizer`` resolves a mask token given by name."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise DraftConfigError(f"{path} is not a draft checkpoint: no config.json")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise DraftConfigError(f"{config_file}: invalid JSON: {e}") from e
    cfg = DFlashConfig.from_dict(raw, tokenizer.token_id if tokenizer is not None else None)
    cfg.check_target(target)
    store = TensorStore(path)
    with torch.device("meta"):
        model = DFlashDraftModel(cfg)
    expected = dict(model.named_parameters())
    missing = sorted(set(expected) - set(store.names()))
    unknown = sorted(set(store.names()) - set(expected))
    if missing:
        raise CheckpointError(f"{path}: draft tensors missing: {', '.join(missing[:6])}"
                              + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else ""))
    if unknown:
        raise CheckpointError(f"{path}: unknown draft tensors: {', '.join(unknown[:6])}")
    values = {}
    for name, p in expected.items():
        _, shape = store.info(name)
        if tuple(shape) != tuple(p.shape):
            raise CheckpointError(f"{path}: {name} has shape {list(shape)}, the config needs "
                                  f"{list(p.shape)}")
        values[name] = store.read(name).to(device=device, dtype=dtype)
    model.load_state_dict(values, assign=True)
    return model.eval()


def draft_shape(target: ModelConfig, num_layers: int = 2) -> dict:
    d = target.hidden_size
    head_dim = 128 if d >= 1024 else max(2, d // 4)
    heads = max(1, d // head_dim)
    return dict(num_layers=num_layers, num_heads=heads, num_kv_heads=max(1, heads // 4),
                head_dim=head_dim, intermediate_size=3 * d)


def random_draft_config(target: ModelConfig, block_size: int = 8, num_layers: int = 2,
                        target_layer_ids: tuple[int, ...] | None = None,
                        mask_token_id: int = TINY_SPECIALS[MASK_TOKEN],
                        selector_rank: int = 16, selector_top_k: int = 8) -> DFlashConfig:
    """Defaults: the mask token of the tokenizer glmlab writes with every checkpoint it makes."""
    ids = target_layer_ids or default_target_layers(target.num_layers, num_layers)
    return DFlashConfig(hidden_size=target.hidden_size, vocab_size=target.vocab_size,
                        block_size=block_size, target_layer_ids=tuple(ids),
                        mask_token_id=mask_token_id, selector_rank=selector_rank,
                        selector_top_k=selector_top_k, **draft_shape(target, num_layers))


def write_random_draft(target: ModelConfig, out: str | Path, seed: int = 0,
                       mask_token: str | None = MASK_TOKEN, **config) -> Path:
    """A random draft checkpoint for ``target``; ``config`` as for ``random_draft_config``."""
    cfg = random_draft_config(target, **config)
    with torch.device("cpu"):
        model = DFlashDraftModel(cfg)
    init_random_draft_(model, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(mask_token), indent=2) + "\n")
    tensors = {n: p.detach().to(torch.bfloat16).contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@torch.no_grad()
def init_random_draft_(model: DFlashDraftModel, seed: int = 0) -> DFlashDraftModel:
    """Random weights whose values depend only on (seed, name); activations stay O(1)."""
    for name, p in model.named_parameters():
        device = p.device if p.device.type != "meta" else torch.device("cpu")
        gen = torch.Generator(device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        noise = torch.randn(p.shape, generator=gen, device=device)
        # norm weights near 1; matrices (projections, codebooks) scaled by their fan-in
        value = 1.0 + 0.1 * noise if p.dim() == 1 else noise / math.sqrt(p.shape[-1])
        p.data = value.to(p.dtype if p.device.type != "meta" else torch.float32)
    return model
