"""Routing capture: the top-k expert ids a model's routers choose on a real run, as samples.

``capture_routing`` hooks every MoE router of a ``GLM5Model``, prefills some prompts (in chunks)
and decodes greedy steps, and returns ``glmlab.kernels.moe.samples.RoutingSamples`` for the MoE
tuner (``glmlab tune moe``) and benchmarks. It lives above the model so the kernels package never
imports it; the sample format and route drawing stay with the kernels.
"""

from __future__ import annotations

import re

import torch

from glmlab.kernels.moe.samples import RoutingSample, RoutingSamples
from glmlab.model.moe import Router
from glmlab.model.session import Session


@torch.inference_mode()
def capture_routing(model, prompts: list[list[int]], decode_steps: int, source: str = "",
                    chunk: int | None = None) -> RoutingSamples:
    """Run ``model`` (a ``GLM5Model``) on ``prompts`` and record every router's top-k ids.

    The prompts are prefilled together, ``chunk`` tokens per sequence per step (all at once when
    None); then each step decodes one greedy token per prompt. Every forward is one step; MoE
    layers are identified by their index in ``model.layers``.
    """
    captured: list[RoutingSample] = []
    step = [0]
    hooks = []
    for name, mod in model.named_modules():
        match = re.fullmatch(r"layers\.(\d+)\.mlp\.gate", name)
        if isinstance(mod, Router) and match:
            layer = int(match.group(1))

            def hook(_mod, _inp, out, layer=layer):
                captured.append(RoutingSample(layer, step[0], out[1].detach().long().cpu()))

            hooks.append(mod.register_forward_hook(hook))
    try:
        longest = max(map(len, prompts))
        session = Session(model, num_seqs=len(prompts), max_len=longest + decode_steps + 1)
        chunk = chunk or longest
        for start in range(0, longest, chunk):
            part = {i: p[start:start + chunk] for i, p in enumerate(prompts)
                    if p[start:start + chunk]}
            logits = dict(zip(part, session.logits(part), strict=True))
            step[0] += 1
        for _ in range(decode_steps):
            nxt = {i: [int(lg[-1].argmax())] for i, lg in logits.items()}
            logits = dict(zip(nxt, session.logits(nxt), strict=True))
            step[0] += 1
    finally:
        for h in hooks:
            h.remove()
    cfg = model.cfg.moe
    return RoutingSamples(tuple(captured), cfg.num_experts, cfg.top_k, source)
