"""The reference decode point's cache: one shared prefix stored once, a private tail per request.

The published decode benchmark sends 64K-token prompts of which 99.9% (65,472 tokens, 1,023 pages
of 64) is one shared prefix, behind a KV-only decode radix cache: the prefix's KV (target and
draft) is held once and every request's page table points at it; each request owns only the pages
of its private suffix and of what it decodes, and its own KDA state slot. ``SharedPrefixLayout``
is that arrangement over a ``ModelCache`` without a radix tree or scheduler (nothing is prefilled:
``fill_random_`` writes random rows, since a step's cost depends on how much it reads, not on the
values): page 0 and state slot 0 are scratch, pages 1..P the prefix, then each request's run of
private pages; request i is row (state slot) i + 1.

As a ``glmlab.speculative.types.CacheLayout`` it lets ``SpecDecoder`` and the drafters run cycles
on it; ``forward`` replays a CUDA graph of the step's batch bucket when ``graphs`` holds one (as
``ModelRunner.forward`` does) and runs eagerly otherwise. Collectives issued inside ``forward``
are tagged ``verify`` on ``recorder`` (the target step of a cycle, or a plain decode step).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.engine.cuda_graph import CudaGraphRunner, replay_ready
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult
from glmlab.model.session import run_step
from glmlab.speculative.draft_kv import DraftKVStore


@dataclass(frozen=True)
class SharedPrefix:
    """Token counts of the workload: every request is ``prefix_len`` shared + ``suffix_len``
    private prompt tokens, with room for ``headroom`` more (the cycles it will decode)."""

    batch: int
    prefix_len: int = 65_472  # 99.9% of 65,536, page aligned (1,023 pages of 64)
    suffix_len: int = 64
    headroom: int = 256
    page_size: int = 64

    def __post_init__(self) -> None:
        if self.prefix_len % self.page_size:
            raise ValueError(f"the shared prefix ({self.prefix_len}) must fill whole pages of "
                             f"{self.page_size}")

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.suffix_len

    @property
    def prefix_pages(self) -> int:
        return self.prefix_len // self.page_size

    @property
    def private_pages(self) -> int:
        return -(-(self.suffix_len + self.headroom) // self.page_size)

    @property
    def num_pages(self) -> int:  # scratch + prefix + private runs
        return 1 + self.prefix_pages + self.batch * self.private_pages

    @property
    def num_token_slots(self) -> int:
        return self.num_pages * self.page_size


class SharedPrefixLayout:
    def __init__(self, model, work: SharedPrefix, dtypes: CacheDtypes, recorder=None):
        self.model, self.work, self.recorder = model, work, recorder
        device = model.embed_tokens.weight.device
        self.cache = ModelCache(model.cfg, work.num_token_slots, work.batch + 1, work.page_size,
                                dtypes, device, with_mtp=model.mtp is not None)
        shared = torch.arange(1, 1 + work.prefix_pages)
        own = torch.arange(work.batch * work.private_pages).view(work.batch, -1)
        own = own + 1 + work.prefix_pages
        table = torch.cat([shared.expand(work.batch, -1), own], dim=1)  # [N, pages]
        self.page_table = torch.cat([torch.zeros_like(table[:1]), table]).to(device)  # row 0
        self.graphs: CudaGraphRunner | None = None

    @property
    def max_pages(self) -> int:
        return self.page_table.shape[1]

    def plan(self, rows: list[int], seq_lens: list[int], cache_lens: list[int],
             verify=None) -> ForwardPlan:
        for r, n, c in zip(rows, seq_lens, cache_lens, strict=True):
            if c + n > self.capacity(r):
                raise ValueError(f"row {r}: {c} + {n} tokens exceed {self.capacity(r)}")
        return ForwardPlan.build(seq_lens, cache_lens, rows, self.page_table[rows],
                                 self.work.page_size, verify=verify)

    def forward(self, plan: StepPlan) -> StepResult:
        scope = (self.recorder.scope("verify") if self.recorder is not None
                 else contextlib.nullcontext())
        with scope:
            if self.graphs is not None and replay_ready(self.graphs, plan):
                return self.graphs.run(plan)
            return run_step(self.model, self.cache, plan)

    def token_slots(self, row: int, start: int, end: int) -> torch.Tensor:
        s = self.work.page_size
        pos = torch.arange(start, end, device=self.page_table.device)
        return self.page_table[row, pos // s] * s + pos % s

    def capacity(self, row: int) -> int:
        return self.max_pages * self.work.page_size

    def kv_bytes(self) -> dict[str, int]:
        """Bytes of the target KV the workload uses: the prefix once, the private pages each."""
        per_token = self.cache.bytes_per_token()
        w = self.work
        return {"shared_prefix": w.prefix_len * per_token,
                "private": w.batch * w.private_pages * w.page_size * per_token,
                "allocated": w.num_token_slots * per_token}


CHUNK = 1 << 14  # rows written per call when filling


@torch.no_grad()
def fill_random_(cache: ModelCache, draft_kv: DraftKVStore | None = None, seed: int = 0) -> None:
    """Random content in every row, through the cache's own writers (FP8 rows get real scales):
    latent rows and pooled keys of every token slot, every state slot's KDA and tail state, and
    the draft K/V rows."""
    dev = cache.device
    g = torch.Generator(dev).manual_seed(seed)
    d, kp = cache.cfg.dsa, cache.cfg.dsa.index_kpool
    for layer in cache.latent:
        for s in range(0, cache.num_token_slots, CHUNK):
            slots = torch.arange(s, min(s + CHUNK, cache.num_token_slots), device=dev)
            cache.write_latent(layer, slots, _randn(len(slots), d.kv_lora_rank, g, dev))
            pools = slots[::kp] // kp
            cache.write_pool_keys(layer, pools, _randn(len(pools), d.index_head_dim, g, dev))
    for t in (*cache.index_tail.values(), *cache.conv.values(), *cache.recurrent.values()):
        t.copy_(0.1 * torch.randn(t.shape, generator=g, device=dev, dtype=torch.float32))
    if draft_kv is None:
        return
    for rows in (*draft_kv.k, *draft_kv.v):
        for s in range(0, rows.shape[0], CHUNK):
            part = rows[s:s + CHUNK]
            value = torch.randn(part.shape, generator=g, device=dev, dtype=torch.float32)
            if part.dtype == torch.bfloat16:
                part.copy_(value)
            else:  # FP8 rows with their unit scales
                part.copy_(value.clamp(-4, 4).to(part.dtype))


def _randn(n: int, width: int, g: torch.Generator, device) -> torch.Tensor:
    return torch.randn(n, width, generator=g, device=device, dtype=torch.float32)
