"""Time spent in each kind of sublayer during one eager forward: KDA, DSA, MoE, dense MLP.

``LayerTimer(model)`` hooks every decoder layer's ``self_attn`` and ``mlp`` (whatever wraps them:
TP shards, CP wrappers) with CUDA events (on CPU: wall clock), and ``by_kind()`` sums the
milliseconds per kind after the forward; what is left of the step (embedding, mHC, norms, head,
lm_head, sampling) is the caller's total minus these. Meant for one eager pass: the events
synchronise nothing, but a CUDA-graph replay runs no hooks at all. Knows no benchmark.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


def kind_of(module: torch.nn.Module) -> str:
    name = type(module).__name__
    for key, kind in (("KDA", "kda"), ("DSA", "dsa"), ("MoE", "moe"), ("MLP", "mlp")):
        if key in name:
            return kind
    inner = getattr(module, "inner", None)
    return kind_of(inner) if inner is not None else name.lower()


class LayerTimer:
    def __init__(self, model: torch.nn.Module):
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.marks: list[tuple[str, object, object]] = []
        self._open: dict[int, object] = {}
        self._hooks = []
        for layer in model.layers:
            for sub in (layer.self_attn, layer.mlp):
                self._hooks.append(sub.register_forward_pre_hook(self._start))
                self._hooks.append(sub.register_forward_hook(self._stop))

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _start(self, module, args) -> None:
        self._open[id(module)] = self._now()

    def _stop(self, module, args, out) -> None:
        self.marks.append((kind_of(module), self._open.pop(id(module)), self._now()))

    def by_kind(self) -> dict[str, float]:
        """Milliseconds per kind over everything timed so far (waits for the device)."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = defaultdict(float)
        for kind, a, b in self.marks:
            out[kind] += a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return dict(out)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def __enter__(self) -> LayerTimer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
