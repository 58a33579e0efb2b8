"""A rank's TP/EP shard of a random checkpoint, drawn on its device without writing the checkpoint.

At full size the FP8 checkpoint is ~320 GB: more than a 4- or 8-GPU host's 235 GiB disk, and
more than one GPU could load before sharding. Its weights are random, though, and the random
writer draws each parameter from a generator seeded by (seed, parameter name, device)
(``checkpoint.writer.random_parameter``). So a rank can draw the checkpoint's parameters block
by block on its GPU, put each into the form the checkpoint stores and the loader reads back
(block-FP8 E4M3 + scales, bf16, or the fp32-kept parameters), and shard the block before drawing
the next one. The result equals ``apply_tp(load_model(write_random_checkpoint(config, seed=seed,
fp8=fp8, device=D)), groups)`` parameter for parameter (the test checks it on the tiny model);
at most one unsharded block (one MoE layer: ~7 GB FP8, ~20 GB while its fp32 stack is drawn) is
resident besides the shards.

``random_cp_prefill`` does the same for a rank of interleaved CP prefill (``cp.CPPrefill``): each
decoder layer is drawn whole, then wrapped for CP (its KDA heads and routed experts split) before
the next one is drawn.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from glmlab.checkpoint.writer import fp8_parameter_names, random_parameter, stored_in_fp32
from glmlab.config import ModelConfig
from glmlab.distributed.cp import CPConfig, CPPrefill
from glmlab.distributed.parallel import ProcessGroups
from glmlab.distributed.tp import check_layout, shard_block, tp_config
from glmlab.kernels.fp8.ref import dequant_block_fp8, quant_block_fp8
from glmlab.model.glm import FP32_PARAMS, GLM5Model
from glmlab.model.layers import Linear
from glmlab.model.moe import Experts


def random_tp_model(config: dict | ModelConfig, groups: ProcessGroups, seed: int = 0,
                    fp8: bool = False, fp8_mode: Literal["dequantize", "keep"] = "keep",
                    dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                    with_mtp: bool = True) -> GLM5Model:
    """This rank's shard of the random model ``write_random_checkpoint(config, seed=seed,
    fp8=fp8, device=device)`` would write, loaded with ``dtype`` / ``fp8_mode``."""
    check_layout(groups)
    cfg, model, draw = _model_on_meta(config, with_mtp, seed, fp8, fp8_mode, dtype, device)
    blocks = [(f"layers.{i}", layer) for i, layer in enumerate(model.layers)]
    if model.mtp is not None:
        blocks.append(("mtp", model.mtp))
    tp = groups.info.tp_size
    for prefix, block in blocks:
        draw.module(block, prefix)
        if tp > 1:
            shard_block(block, cfg, groups)
    if tp > 1:
        model.cfg = tp_config(cfg, tp)
    return model.eval()


def random_cp_prefill(config: dict | ModelConfig, groups: ProcessGroups,
                      cp: CPConfig | None = None, seed: int = 0, fp8: bool = False,
                      fp8_mode: Literal["dequantize", "keep"] = "keep",
                      dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> CPPrefill:
    """This rank's ``CPPrefill`` over the random model of ``random_tp_model``'s arguments (no MTP
    layer: CP prefill does not run it), equal to ``CPPrefill(load_model(...), groups, cp)``."""
    _, model, draw = _model_on_meta(config, False, seed, fp8, fp8_mode, dtype, device)
    runner = CPPrefill(model.eval(), groups, cp, wrap=False)
    for i, layer in enumerate(model.layers):
        draw.module(layer, f"layers.{i}")
        runner.wrap_layer(layer)
    return runner


def _model_on_meta(config: dict | ModelConfig, with_mtp: bool, seed: int, fp8: bool,
                   fp8_mode: str, dtype: torch.dtype, device: str
                   ) -> tuple[ModelConfig, GLM5Model, _Drawer]:
    """The model's skeleton on the meta device with its embedding, final norm and lm_head drawn,
    and the drawer for its blocks (drawn and placed one at a time by the caller)."""
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_hf(config)
    with torch.device("meta"):
        model = GLM5Model(cfg, with_mtp=with_mtp)
    draw = _Drawer(seed, fp8_parameter_names(model) if fp8 else set(), fp8_mode, dtype,
                   torch.device(device), cfg.fp8.block if cfg.fp8 else (128, 128))
    for name in ("embed_tokens", "norm", "lm_head"):
        draw.module(getattr(model, name), name)
    return cfg, model, draw


class _Drawer:
    """Draws parameters in the form the checkpoint stores them and the loader reads them back."""

    def __init__(self, seed: int, fp8_names: set[str], fp8_mode: str, dtype: torch.dtype,
                 device: torch.device, block: tuple[int, int]):
        self.seed, self.fp8_names, self.fp8_mode = seed, fp8_names, fp8_mode
        self.dtype, self.device, self.block = dtype, device, block

    def module(self, root: nn.Module, prefix: str) -> None:
        for mod_name, m in list(root.named_modules(prefix=prefix)):
            if isinstance(m, Experts):
                self.experts(m, mod_name)
                continue
            for attr, p in list(m.named_parameters(recurse=False)):
                self.parameter(m, attr, p, f"{mod_name}.{attr}")

    @torch.no_grad()
    def parameter(self, owner: nn.Module, attr: str, p: torch.Tensor, name: str) -> None:
        value = random_parameter(name, tuple(p.shape), self.seed, self.device)  # fp32
        if name in self.fp8_names:
            q, s = quant_block_fp8(value, self.block)
            if self.fp8_mode == "keep" and isinstance(owner, Linear):
                owner.set_fp8(q, s, self.block)
                return
            value = dequant_block_fp8(q, s, self.dtype, self.block)
        else:  # through the checkpoint's storage dtype, then the loader's target dtype
            value = value if stored_in_fp32(name) else value.to(torch.bfloat16)
        want = torch.float32 if any(k in name for k in FP32_PARAMS) else self.dtype
        setattr(owner, attr, nn.Parameter(value.to(want), requires_grad=False))

    @torch.no_grad()
    def experts(self, m: Experts, name: str) -> None:
        """Stacks drawn whole (their generator covers the stack), stored per expert and part."""
        inter = m.w13.shape[1] // 2
        w13 = random_parameter(f"{name}.w13", tuple(m.w13.shape), self.seed, self.device)
        parts13 = [self._stored(f"{name}.w13", w) for e in range(w13.shape[0])
                   for w in (w13[e, :inter], w13[e, inter:])]
        del w13
        w2 = random_parameter(f"{name}.w2", tuple(m.w2.shape), self.seed, self.device)
        parts2 = [self._stored(f"{name}.w2", w2[e]) for e in range(w2.shape[0])]
        del w2
        if parts2[0][1] is not None:  # FP8 kept: E4M3 stacks + per-block scales
            m.set_fp8(torch.stack([torch.cat([g[0], u[0]]) for g, u in _pairs(parts13)]),
                      torch.stack([torch.cat([g[1], u[1]]) for g, u in _pairs(parts13)]),
                      torch.stack([q for q, _ in parts2]), torch.stack([s for _, s in parts2]),
                      self.block)
            return
        m.w13 = nn.Parameter(torch.stack([torch.cat([g[0], u[0]]) for g, u in _pairs(parts13)])
                             .to(self.dtype), requires_grad=False)
        m.w2 = nn.Parameter(torch.stack([w for w, _ in parts2]).to(self.dtype),
                            requires_grad=False)

    def _stored(self, name: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(E4M3, scales) when kept FP8; else (the value as the loader returns it, None)."""
        if name not in self.fp8_names:
            return w.to(torch.bfloat16), None
        q, s = quant_block_fp8(w, self.block)
        if self.fp8_mode == "keep":
            if w.shape[0] % self.block[0] and name.endswith(".w13"):
                raise ValueError(f"fp8_mode='keep' stacks gate and up rows, so the expert "
                                 f"intermediate size ({w.shape[0]}) must be a multiple of the "
                                 f"FP8 block ({self.block[0]}); use fp8_mode='dequantize'")
            return q, s
        return dequant_block_fp8(q, s, self.dtype, self.block), None


def _pairs(parts: list) -> list:
    return list(zip(parts[0::2], parts[1::2], strict=True))
