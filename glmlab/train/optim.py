"""AdamW over fp32 master weights, with linear warm-up and cosine decay.

Mixed precision here means the model *is* the serving model in bf16 (``GLM5Model.to_dtype``
keeps the fp32 islands: KDA decay parameters, mHC base/scale, correction biases) while the
optimiser keeps an fp32 master copy of every parameter: gradients arrive in the parameter's
dtype, the update happens in fp32, and the result is rounded back into the model. Autocast is
not used on purpose: it would run the model's explicit fp32 maths (router logits, mHC
coefficients) as bf16 matmuls, so training would not compute what the engine computes.

Weight decay applies to matrices only (not norms, biases, gates' 1-D parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Schedule:
    peak_lr: float
    warmup_steps: int
    total_steps: int
    min_ratio: float = 0.1

    def lr(self, step: int) -> float:
        """Learning rate for 0-based ``step``."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.peak_lr * (self.min_ratio
                               + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class MasterAdamW:
    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], weight_decay: float,
                 betas: tuple[float, float] = (0.9, 0.95), grad_clip: float = 1.0):
        self.params = [p for _, p in named_params]
        self.masters = [p if p.dtype == torch.float32 else
                        p.detach().float().clone().requires_grad_(True) for p in self.params]
        decay = [m for (_, p), m in zip(named_params, self.masters, strict=True) if p.dim() >= 2]
        other = [m for (_, p), m in zip(named_params, self.masters, strict=True) if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay},
             {"params": other, "weight_decay": 0.0}], lr=0.0, betas=betas)
        self.grad_clip = grad_clip

    def step(self, lr: float) -> float:
        """Update with learning rate ``lr``; returns the gradient norm before clipping."""
        for p, m in zip(self.params, self.masters, strict=True):
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
        norm = torch.nn.utils.clip_grad_norm_(self.masters, self.grad_clip)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=True):
                if m is not p:
                    p.copy_(m)
        self.zero_grad()
        return float(norm)

    def zero_grad(self) -> None:
        for p, m in zip(self.params, self.masters, strict=True):
            p.grad = None
            m.grad = None
