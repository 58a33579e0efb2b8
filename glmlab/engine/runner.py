"""Runner: a ``Batch`` in, next-token logits out. The only engine piece that touches tensors.

``plan`` turns the batch into a ``StepPlan`` once per step: the flat input ids, the
``ForwardPlan`` (sequence lengths, cached lengths, state slots, page table -> token slots) and the
rows whose logits are sampled. Every tensor is built here, from host lists, with one copy to the
device each; the model's layers only read the plan, so nothing in the step waits on the device
except the sampler's final read of the chosen tokens.

Padding the page table uses page 0, the pools' reserved scratch page, which no request owns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmlab.cache.hybrid import HybridCache
from glmlab.engine.types import Batch
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan


@dataclass(frozen=True)
class StepPlan:
    batch: Batch
    input_ids: torch.Tensor  # [T]
    forward: ForwardPlan
    sample_rows: torch.Tensor  # [num sampled] rows of the flat batch whose logits are sampled


class Runner:
    def __init__(self, model: GLM5Model, cache: HybridCache):
        self.model, self.cache = model, cache
        self.device = model.embed_tokens.weight.device
        self.page_size = cache.page_size

    def plan(self, batch: Batch) -> StepPlan:
        entries = batch.entries
        ids, rows, end = [], [], 0
        for e in entries:
            ids.extend(e.req.token_ids[e.start:e.start + e.num_tokens])
            end += e.num_tokens
            if e.samples:
                rows.append(end - 1)
        width = max(self.cache.pages_for(e.start + e.num_tokens) for e in entries)
        table = [e.req.cache.pages[:width] + [0] * (width - len(e.req.cache.pages[:width]))
                 for e in entries]
        dev = self.device
        forward = ForwardPlan.build(
            [e.num_tokens for e in entries], [e.start for e in entries],
            [e.req.cache.slot for e in entries],
            torch.tensor(table, dtype=torch.long, device=dev), self.page_size)
        return StepPlan(batch, torch.tensor(ids, dtype=torch.long, device=dev), forward,
                        torch.tensor(rows, dtype=torch.long, device=dev))

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> torch.Tensor:
        """fp32 logits [num sampled, V] of the sampled rows."""
        hidden, _ = self.model(plan.input_ids, plan.forward, self.cache.storage)
        return self.model.logits(hidden[plan.sample_rows])
