"""Run the same prefill on one device and under CP, so the two can be compared token for token.

A ``PrefillCase`` is a few prompts of given lengths, fed whole or in chunks (every sequence gets
its next ``chunk`` tokens each step, as a chunked-prefill scheduler would). ``prefill_logits``
drives any ``forward(ids, plan, cache) -> hidden [T, D]`` through the steps with a contiguous
page layout and returns the fp32 logits of every prompt token. ``cp_prefill_logits`` is the
per-rank entry point for ``parallel.launch``: load a checkpoint, transform it for CP, run cases.
Used by the ``glmlab dist`` command, the tests and notebook 06.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.checkpoint.loader import load_model
from glmlab.distributed.cp import CPConfig, CPPrefill
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PrefillCase:
    prompt_lens: tuple[int, ...] = (64,)
    chunk: int = 0  # tokens per sequence per step; 0 = each prompt in one step
    seed: int = 0
    page_size: int = 16

    def prompts(self, vocab_size: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed)
        return [torch.randint(0, vocab_size, (n,), generator=gen).tolist()
                for n in self.prompt_lens]

    def steps(self) -> list[list[tuple[int, int, int]]]:
        """Per step, (sequence, first position, tokens) of every sequence that still has input."""
        out, done = [], [0] * len(self.prompt_lens)
        while any(d < n for d, n in zip(done, self.prompt_lens, strict=True)):
            step = []
            for s, n in enumerate(self.prompt_lens):
                take = min(self.chunk or n, n - done[s])
                if take:
                    step.append((s, done[s], take))
                    done[s] += take
            out.append(step)
        return out

    def cache_shape(self) -> tuple[int, int]:
        """(token slots, state slots) of a contiguous layout holding every prompt."""
        pages = -(-max(self.prompt_lens) // self.page_size)
        return len(self.prompt_lens) * pages * self.page_size, len(self.prompt_lens)


Forward = Callable[[torch.Tensor, ForwardPlan, ModelCache], torch.Tensor]


def prefill_logits(model: GLM5Model, forward: Forward, cache: ModelCache,
                   case: PrefillCase) -> torch.Tensor:
    """Logits [sum(prompt_lens), V] fp32, prompt by prompt, of ``case`` run through ``forward``."""
    device = model.embed_tokens.weight.device
    prompts = case.prompts(model.cfg.vocab_size)
    table = torch.arange(cache.num_pages, device=device).view(len(prompts), -1)
    per_seq: list[list[torch.Tensor]] = [[] for _ in prompts]
    with torch.inference_mode():
        for step in case.steps():
            seqs = [s for s, _, _ in step]
            plan = ForwardPlan.build([n for _, _, n in step], [p for _, p, _ in step], seqs,
                                     table[seqs], case.page_size)
            ids = torch.tensor([t for s, p, n in step for t in prompts[s][p:p + n]],
                               device=device)
            hidden = forward(ids, plan, cache)
            for (s, _, _), h in zip(step, hidden.split(plan.seq_lens), strict=True):
                per_seq[s].append(model.logits(h))
    return torch.cat([torch.cat(chunks) for chunks in per_seq]).cpu()


def single_prefill_logits(model: GLM5Model, case: PrefillCase) -> torch.Tensor:
    """The reference: the untransformed model on one device."""
    slots, states = case.cache_shape()
    cache = ModelCache(model.cfg, slots, states, case.page_size, CacheDtypes.like(model.dtype),
                       model.embed_tokens.weight.device, with_mtp=model.mtp is not None)
    return prefill_logits(model, lambda ids, plan, c: model(ids, plan, c)[0], cache, case)


def cp_logits(runner: CPPrefill, case: PrefillCase) -> torch.Tensor:
    slots, states = case.cache_shape()
    cache = runner.new_cache(slots, states, case.page_size)
    return prefill_logits(runner.model, runner.hidden, cache, case)


def cp_prefill_logits(model_path: str, dtype: str, layout: ParallelLayout,
                      runs: list[tuple[CPConfig, PrefillCase]]) -> list[torch.Tensor]:
    """Per-rank entry for ``parallel.launch``: each run loads the checkpoint afresh, transforms
    it for CP with ``layout`` and returns the step logits (the same on every rank)."""
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    groups = ProcessGroups.build(layout)
    out = []
    for cfg, case in runs:
        model = load_model(model_path, dtype=DTYPES[dtype], device=device, with_mtp=False)
        out.append(cp_logits(CPPrefill(model, groups, cfg), case))
    return out
