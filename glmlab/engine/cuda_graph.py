"""CUDA graphs of uniform steps: decode (1 token per request) and verify (D tokens per request).

As SGLang's CUDA graph runner does, a forward is captured per *bucket* of batch sizes (1, 2, 4, 8,
16, 24, ..., ``max_bs``) and per step width, over static input buffers: input ids, positions,
page table, write slots, state slots. A step of N <= max_bs requests replays the smallest bucket
>= N after copying its inputs into the buffers; the rows past N are padding that reads and writes
only the pools' scratch page 0 and scratch state slot (never handed to a request). Steps that are
not uniform, wider than ``max_bs`` or of a width with no graphs run eagerly.

A captured forward bakes in everything the host decided at capture time, so it is only correct
for model paths that take every length from the plan's device tensors: the fused uniform-step
backends (``kda_step``, ``dsa_index``, ``moe`` on ``triton``; ``Backends.fast()``). ``check``
refuses other backends. A verify graph also bakes in its ``VerifyRecorder`` (the speculative state
store): one set of graphs per recorder, and padded rows are allowed only when the recorder maps
the scratch state slot to a row no request uses (otherwise only full buckets replay).

Graph memory (one shared pool, largest bucket captured first so smaller ones reuse it, plus the
static buffers and outputs) is measured at capture and reported by ``memory_bytes`` for the budget.
Knows nothing about scheduling or sampling.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import torch

from glmlab.cache.storage import ModelCache
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult
from glmlab.model.session import run_step

SCRATCH_PAGE = 0  # glmlab.cache.pools: id 0 of every pool is reserved scratch
SCRATCH_SLOT = 0
NEEDS_FUSED = ("kda_step", "dsa_index", "moe")


def batch_buckets(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_bs`` (and ``max_bs`` itself)."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    out = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 8))
    return out if out[-1] == max_bs else [*out, max_bs]


def check(model: GLM5Model) -> None:
    """Raise unless the model's bound backends keep every length on the device."""
    slow = [f"{name}={getattr(model.backends, name)}" for name in NEEDS_FUSED
            if getattr(model.backends, name) != "triton"]
    if slow:
        raise ValueError(f"CUDA graphs need the fused uniform-step backends (Backends.fast()); "
                         f"these read host lengths or synchronise: {', '.join(slow)}")


@dataclass
class _Buffers:
    """Static inputs of one step width, sized for the largest bucket."""

    ids: torch.Tensor  # [max_bs * w]
    positions: torch.Tensor  # [max_bs * w]
    write_slots: torch.Tensor  # [max_bs * w]
    state_slots: torch.Tensor  # [max_bs]
    page_table: torch.Tensor  # [max_bs, max_pages]
    cu_seqlens: torch.Tensor  # [max_bs + 1]
    pad_positions: torch.Tensor  # [max_bs * w] what padding rows hold: 0..w-1 per request

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    result: StepResult  # static outputs of the captured forward (every row's logits)


class CudaGraphRunner:
    def __init__(self, model: GLM5Model, cache: ModelCache, max_bs: int, max_pages: int,
                 buckets: list[int] | None = None):
        """``max_pages``: page-table width the graphs serve (longest context / page size);
        ``buckets``: batch sizes to capture (default ``batch_buckets(max_bs)``)."""
        check(model)
        self.model, self.cache = model, cache
        self.page_size = cache.page_size
        self.buckets = sorted(buckets) if buckets else batch_buckets(max_bs)
        self.max_bs, self.max_pages = self.buckets[-1], max_pages
        self.device = model.embed_tokens.weight.device
        self.pool = torch.cuda.graph_pool_handle()
        self._buffers: dict[int, _Buffers] = {}
        self._graphs: dict[tuple, _Graph] = {}  # (width, recorder id, capture layers, bucket)
        self._pad_ok: dict[int, bool] = {}  # recorder id -> padding rows are harmless
        self._captured: set[tuple] = set()  # (width, recorder id, capture layers)
        self.graph_bytes = 0
        self.reserved = 0  # what the memory budget set aside (``planned_reserve``), if anything

    # ------------------------------------------------------------------ capture
    def _buf(self, width: int) -> _Buffers:
        if width not in self._buffers:
            if width > self.page_size:
                raise ValueError(f"width {width} exceeds the page size {self.page_size}")
            n, dev, i64 = self.max_bs * width, self.device, torch.long
            pad = torch.arange(width, device=dev, dtype=i64).repeat(self.max_bs)
            self._buffers[width] = _Buffers(
                ids=torch.zeros(n, dtype=i64, device=dev), positions=pad.clone(),
                write_slots=pad + SCRATCH_PAGE * self.page_size,
                state_slots=torch.full((self.max_bs,), SCRATCH_SLOT, dtype=i64, device=dev),
                page_table=torch.full((self.max_bs, self.max_pages), SCRATCH_PAGE, dtype=i64,
                                      device=dev),
                cu_seqlens=torch.arange(self.max_bs + 1, device=dev, dtype=i64) * width,
                pad_positions=pad)
        return self._buffers[width]

    def _static_plan(self, width: int, bs: int, verify, capture_layers) -> StepPlan:
        b = self._buf(width)
        t = bs * width
        forward = ForwardPlan(
            seq_lens=(width,) * bs, cache_lens=(0,) * bs, state_slots=b.state_slots[:bs],
            page_size=self.page_size, write_slots=b.write_slots[:t],
            cu_seqlens=b.cu_seqlens[:bs + 1], verify=verify, page_table=b.page_table[:bs],
            positions=b.positions[:t])
        return StepPlan(b.ids[:t], forward, None, tuple(capture_layers))

    def capture(self, width: int = 1, verify=None, capture_layers: tuple[int, ...] = ()) -> None:
        """Capture every bucket of one width (largest first, one shared memory pool)."""
        rid = id(verify) if verify is not None else None
        self._captured.add((width, rid, tuple(capture_layers)))
        if verify is not None and rid not in self._pad_ok:
            row = verify.rows(torch.tensor([SCRATCH_SLOT], device=self.device))
            self._pad_ok[rid] = int(row[0]) >= 0  # at capture time, not in a step
        self._buf(width)
        for bs in sorted(self.buckets, reverse=True):
            key = (width, rid, tuple(capture_layers), bs)
            if key in self._graphs:
                continue
            plan = self._static_plan(width, bs, verify, capture_layers)
            torch.cuda.synchronize(self.device)
            run_step(self.model, self.cache, plan)  # warm-up: compiles kernels, fills caches
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                result = run_step(self.model, self.cache, plan)
            self._graphs[key] = _Graph(graph, result)
        torch.cuda.synchronize(self.device)
        # NOTE: not a difference of memory_reserved: entering a capture empties the allocator's
        # cache, so reserved memory can shrink across a capture that allocated plenty
        self.graph_bytes = (pool_bytes(self.pool)
                            + sum(b.nbytes() for b in self._buffers.values()))
        if self.reserved and self.graph_bytes > self.reserved:
            print(f"CUDA graphs hold {self.graph_bytes / 2**20:,.0f} MiB, more than the "
                  f"{self.reserved / 2**20:,.0f} MiB the budget set aside for them",
                  file=sys.stderr)

    def captured(self, width: int, verify=None, capture_layers: tuple[int, ...] = ()) -> bool:
        return (width, id(verify) if verify is not None else None,
                tuple(capture_layers)) in self._captured

    def memory_bytes(self) -> int:
        """Device bytes the graphs hold: their pool, static inputs and outputs (for the budget)."""
        return self.graph_bytes

    # ------------------------------------------------------------------ replay
    def bucket_for(self, plan: StepPlan) -> int | None:
        """The bucket a step replays in, or None when it runs eagerly."""
        f = plan.forward
        width, n = f.uniform_width, f.num_seqs
        if not width or n > self.max_bs or f.positions is None or f.page_table is None \
                or f.page_table.shape[1] > self.max_pages:
            return None
        rid = id(f.verify) if f.verify is not None else None
        for bs in self.buckets:
            if bs < n or (bs > n and rid is not None and not self._pad_ok.get(rid, False)):
                continue
            if (width, rid, tuple(plan.capture_layers), bs) in self._graphs:
                return bs
        return None

    def run(self, plan: StepPlan) -> StepResult:
        """Replay the step's bucket (``bucket_for`` must not be None)."""
        bs = self.bucket_for(plan)
        if bs is None:
            raise ValueError("no captured graph fits this step; run it eagerly")
        f = plan.forward
        width, n = f.uniform_width, f.num_seqs
        t = n * width
        b = self._buffers[width]
        b.ids[:t].copy_(plan.input_ids)
        b.positions[:t].copy_(f.positions)
        b.write_slots[:t].copy_(f.write_slots)
        b.state_slots[:n].copy_(f.state_slots)
        b.page_table[:n, : f.page_table.shape[1]].copy_(f.page_table)
        if bs > n:  # padding rows: scratch page and slot, positions 0..w-1
            b.positions[t:bs * width].copy_(b.pad_positions[t:bs * width])
            b.write_slots[t:bs * width].copy_(b.pad_positions[t:bs * width]
                                              + SCRATCH_PAGE * self.page_size)
            b.state_slots[n:bs].fill_(SCRATCH_SLOT)
            b.page_table[n:bs].fill_(SCRATCH_PAGE)
        rid = id(f.verify) if f.verify is not None else None
        g = self._graphs[(width, rid, tuple(plan.capture_layers), bs)]
        g.graph.replay()
        r = g.result
        logits = r.logits[:t] if plan.logit_rows is None else r.logits[plan.logit_rows]
        return replace(r, hidden=r.hidden[:t].clone(), features=r.features[:t].clone(),
                       logits=logits.clone() if plan.logit_rows is None else logits)


# What the graphs' shared pool holds besides every bucket's static outputs, calibrated on the H200
# (slice:4, 2026-12-03, one bucket per runner: 54 MiB measured at 1 row, 78 at 32, 182 at 128 and
# at 16 x 8, 1,772 at 136 x 8; this estimate gives 66, 116, 275, 275 and 1,853 MiB):
# - per row of the largest capture: the bf16 logits before their fp32 copy, and ~96 bf16
#   hidden-width activations (projections, MoE rows, attention partials) that the others reuse;
# - a fixed part: the pool owns whole allocator segments (2 MiB blocks for requests up to 1 MiB,
#   20 MiB blocks up to 10 MiB) and the step's size-independent workspaces (split-K partials,
#   expert alignment, sparse-attention partials), 54 MiB at one row. On the tiny model the pool's
#   first segment alone (2 MiB) is more than its rows' estimate (0.8 MB): a budget without the
#   fixed part set aside too little there (seen on the H200).
ACTIVATION_BYTES_PER_ROW = (2, 192)  # x vocab, x hidden
FIXED_POOL_BYTES = 64 << 20


def reserve_bytes(vocab: int, hidden: int, buckets: list[int], widths: tuple[int, ...]) -> int:
    """Device bytes to set aside for the graphs before the cache pools are sized: every
    bucket's static outputs (fp32 logits and bf16 hidden states of each row stay allocated, one
    set per graph) plus the activations of the largest capture, which the others reuse, plus the
    pool's fixed part (``FIXED_POOL_BYTES``)."""
    rows = [b * w for w in widths for b in buckets]
    if not rows:
        return 0
    outputs = sum(rows) * (4 * vocab + 2 * hidden)
    per_row = ACTIVATION_BYTES_PER_ROW[0] * vocab + ACTIVATION_BYTES_PER_ROW[1] * hidden
    return FIXED_POOL_BYTES + outputs + max(rows) * per_row


def pool_bytes(pool) -> int:
    """Device bytes held by the allocator segments of one private memory pool (the graphs')."""
    want = tuple(pool)
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", ())) == want)


def planned_reserve(model: GLM5Model, cfg) -> int:
    """``reserve_bytes`` for the graphs ``make_graph_runner`` would build for ``cfg`` (decode,
    and the verify width when speculating), or 0 when it would build none."""
    if cfg.disable_cuda_graph or model.embed_tokens.weight.device.type != "cuda":
        return 0
    try:
        check(model)
    except ValueError:
        return 0
    widths = (1,) + ((cfg.speculative.width,) if cfg.speculative else ())
    return reserve_bytes(model.cfg.vocab_size, model.cfg.hidden_size,
                         batch_buckets(cfg.cuda_graph_max_bs), widths)


def make_graph_runner(model: GLM5Model, cache: ModelCache, cfg) -> CudaGraphRunner | None:
    """The engine's graph runner for an ``EngineConfig``, or None: graphs disabled, not on CUDA,
    or backends that read host lengths (said once on stderr, so a slow run is explained)."""
    if cfg.disable_cuda_graph or cache.device.type != "cuda":
        return None
    try:
        check(model)
    except ValueError as e:
        print(f"CUDA graphs off: {e}", file=sys.stderr)
        return None
    context = cfg.context_len or model.cfg.max_position_embeddings
    runner = CudaGraphRunner(model, cache, cfg.cuda_graph_max_bs, -(-context // cache.page_size))
    runner.reserved = planned_reserve(model, cfg)
    return runner


def replay_ready(runner: CudaGraphRunner, plan: StepPlan) -> bool:
    """Whether ``plan`` replays a graph, capturing its width's buckets on first use."""
    f = plan.forward
    width = f.uniform_width
    if not width or f.num_seqs > runner.max_bs or width > runner.page_size:
        return False
    if not runner.captured(width, f.verify, plan.capture_layers):
        runner.capture(width, f.verify, plan.capture_layers)
    return runner.bucket_for(plan) is not None
