"""Auxiliary-loss-free load balancing: the router's correction bias follows each expert's load.

As in DeepSeek-V3 and the GLM family: the sigmoid router picks experts by score + bias (the bias
steers selection only; the gate weights use the raw scores), and after every optimiser step each
bias moves by a fixed ``gamma`` towards balance,

    bias_e += gamma * sign(mean_load - load_e)

where load_e counts the tokens routed to expert e in that step (all its forward calls: the MTP
layer's router runs once per MTP depth). No gradient reaches the bias.
"""

from __future__ import annotations

import torch

from glmlab.model.moe import Router


class LoadBalancer:
    def __init__(self, model: torch.nn.Module, gamma: float):
        self.gamma = gamma
        self.routers = {n: m for n, m in model.named_modules() if isinstance(m, Router)}
        self.loads = {n: None for n in self.routers}
        self._hooks = [m.register_forward_hook(self._hook(n)) for n, m in self.routers.items()]

    def _hook(self, name: str):
        def record(_mod, _inp, out):
            _, ids = out
            counts = torch.bincount(ids.flatten(), minlength=self.routers[name].weight.shape[0])
            prev = self.loads[name]
            self.loads[name] = counts if prev is None else prev + counts
        return record

    @torch.no_grad()
    def update(self) -> float:
        """Apply one bias step from the loads seen since the last call; returns the worst
        max/mean load ratio (1.0 = perfectly balanced)."""
        worst = 1.0
        for name, router in self.routers.items():
            load = self.loads[name]
            if load is None:
                continue
            load = load.float()
            mean = load.mean()
            router.e_score_correction_bias.add_(self.gamma * torch.sign(mean - load))
            worst = max(worst, float(load.max() / mean.clamp(min=1.0)))
            self.loads[name] = None
        return worst

    def reset(self) -> None:
        """Forget loads recorded outside training steps (evaluation forwards)."""
        self.loads = dict.fromkeys(self.routers)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
