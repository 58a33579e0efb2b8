"""CP prefill dataflow benchmark (``python -m glmlab.bench.ops --op cp``): two GPUs, NCCL.

Three measurements at GLM-5.3-Flash width (D 4096, 288 experts, top-8), interleaved CP over the
ranks with KDA heads and experts split the same way (tp = ep = cp):

- ``allgather``: the MoE all-gather alone, BF16 hidden states [T, 4096] against FP8 packets
  [T, 4288 B], for each T (tokens of the whole step; each rank holds T/cp).
- ``moe``: one MoE layer (layer 3 of the slice) with each dispatch (``MoEDispatch``): the dispatch
  alone (gather + route + quantise + group) and the whole layer (+ experts + reduce-scatter +
  shared expert). Experts are the torch grouped reference on bf16 weights, identical for every
  dispatch, so layer-time differences come from the dispatch.
- ``prefill``: a whole ``slice:4`` prefill (3 KDA + 1 DSA layer, torch reference ops) of one
  T-token prompt, on one GPU (CP1, the plain model) and under CP over all ranks; input tokens/s.

Weights are random (``glmlab.checkpoint.writer.init_random_``), drawn on the GPU in memory with the
same seed on every rank. Collectives are timed with CUDA events over a fixed number of
repetitions (all ranks must issue the same collectives) after a barrier; a row reports rank 0's
median; a prefill row reports the slowest rank. ``--live-dir`` appends
each row to ``cp-live.jsonl`` as soon as it is measured, so a cut-short run keeps its rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from glmlab.bench.ops import write_rows
from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.checkpoint.writer import init_random_
from glmlab.config import ModelConfig
from glmlab.distributed.cp import CPConfig, CPPrefill
from glmlab.distributed.ep_moe import EPMoE, MoEDispatch
from glmlab.distributed.fp8_packet import PacketKernels, packet_ops
from glmlab.distributed.interleave import CPComm
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups, launch
from glmlab.kernels.fp8.packet_ref import PacketLayout
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan
from glmlab.presets import preset
from glmlab.testing.compare import diff_stats


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op cp")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--preset", default="slice:4", help="model size: slice:N, or tiny (CPU smoke)")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                   help="gloo runs everything on CPU (a smoke run of this script, not a benchmark)")
    p.add_argument("--gather-tokens", default="8192,32768")
    p.add_argument("--moe-tokens", default="8192,32768")
    p.add_argument("--prefill-tokens", default="8192,16384")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions of comm/MoE cases")
    p.add_argument("--prefill-reps", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=150.0,
                   help="skip the remaining prefill cases once this much time has passed")
    p.add_argument("--live-dir", default="", help="append rows to DIR/cp-live.jsonl as measured")
    return p.parse_args(argv)


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    return launch(_rank_main, args.ranks, args, backend=args.backend)[0]


class _Rows:
    """Rank 0 collects rows (and appends each to the live file); other ranks drop theirs."""

    def __init__(self, live_dir: str, base: dict):
        self.rows, self.live, self.base = [], Path(live_dir) if live_dir else None, base
        self.rank0 = dist.get_rank() == 0

    def add(self, **row) -> None:
        if not self.rank0:
            return
        row = {**self.base, **row}
        self.rows.append(row)
        print(row, flush=True)
        if self.live:
            write_rows([row], self.live, "cp-live")


def _device() -> str:
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def _sync() -> None:
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()


def _time_ms(fn, reps: int, warmup: int = 2) -> float:
    """Median of ``reps`` timings of ``fn`` (collective-safe: the same count on every rank)."""
    for _ in range(warmup):
        fn()
    _sync()
    dist.barrier()
    times = []
    for _ in range(reps):
        if dist.get_backend() == "nccl":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(times)


def _rank_main(args: argparse.Namespace) -> list[dict]:
    t0 = time.perf_counter()
    n = dist.get_world_size()
    groups = ProcessGroups.build(ParallelLayout(cp=n, tp=n, ep=n))
    cfg = ModelConfig.from_hf(preset(args.preset))
    rows = _Rows(args.live_dir, {"model": args.preset, "hidden": cfg.hidden_size,
                                 "experts": cfg.moe.num_experts, "top_k": cfg.moe.top_k,
                                 "cp": n, "weights": "random bf16", "ops": "torch reference"})
    _bench_allgather(groups, cfg, args, rows)
    model = _random_model(cfg)
    prefill_sizes = [int(t) for t in args.prefill_tokens.split(",") if t]
    done_cp1, ref = _bench_prefill_cp1(model, prefill_sizes, args, rows, t0)
    runner = CPPrefill(model, groups, CPConfig(MoEDispatch.FP8_PACKET, PacketKernels.TRITON))
    _bench_moe(runner, args, rows)
    if done_cp1:
        _check_cp_against_cp1(runner, done_cp1[0], ref, rows)
    _bench_prefill_cp(runner, done_cp1, args, rows, t0)
    return rows.rows


def _rank0_says(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (so all ranks skip the same collectives)."""
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def _random_model(cfg: ModelConfig) -> GLM5Model:
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # allocate bf16 directly: the experts are 14.5 GB
    try:
        with torch.device(_device()):
            model = GLM5Model(cfg, with_mtp=False)
    finally:
        torch.set_default_dtype(default)
    return init_random_(model, seed=0).to_dtype(torch.bfloat16).eval()


def _bench_allgather(groups: ProcessGroups, cfg: ModelConfig, args, rows: _Rows) -> None:
    comm = CPComm(groups.cp, groups.info.cp_size, groups.info.cp_rank)
    layout = PacketLayout(cfg.hidden_size, cfg.moe.top_k)
    for t in (int(x) for x in args.gather_tokens.split(",") if x):
        local = t // comm.size
        cases = {"bf16": torch.randn(local, cfg.hidden_size, device=_device(),
                                     dtype=torch.bfloat16),
                 "fp8-packet": torch.randint(-2**31, 2**31 - 1, (local, layout.words),
                                             device=_device(), dtype=torch.int32)}
        for name, x in cases.items():
            ms = _time_ms(lambda x=x: comm.all_gather(x), args.reps)
            size = comm.size * x.numel() * x.element_size()
            rows.add(case="allgather", tokens=t, transport=name, bytes_per_token=size // t,
                     gathered_bytes=size, ms=round(ms, 4), algbw_gbs=round(size / ms / 1e6, 1))
        del cases


_MOE_VARIANTS = [(MoEDispatch.BF16, PacketKernels.TORCH),
                 (MoEDispatch.BF16_THEN_FP8, PacketKernels.TORCH),
                 (MoEDispatch.FP8_PACKET, PacketKernels.TORCH),
                 (MoEDispatch.FP8_PACKET, PacketKernels.TRITON)]


def _bench_moe(runner: CPPrefill, args, rows: _Rows) -> None:
    moe: EPMoE = runner.model.layers[-1].mlp
    gen = torch.Generator(device=_device()).manual_seed(1 + runner.info.rank)
    for t in (int(x) for x in args.moe_tokens.split(",") if x):
        h = torch.randn(t // runner.comm.size, moe.layout.hidden, device=_device(),
                        generator=gen, dtype=torch.bfloat16)
        for dispatch, kernels in _MOE_VARIANTS:
            _moe_case(runner, moe, h, dispatch, kernels, args.reps, rows)
    moe.dispatch, (moe.pack, moe.unpack) = MoEDispatch.FP8_PACKET, packet_ops(PacketKernels.TRITON)


def _moe_case(runner: CPPrefill, moe: EPMoE, h: torch.Tensor, dispatch: MoEDispatch,
              kernels: PacketKernels, reps: int, rows: _Rows) -> None:
    """One layer with its experts already split: only how the tokens reach them changes."""
    moe.dispatch, (moe.pack, moe.unpack) = dispatch, packet_ops(kernels)
    t = h.shape[0] * runner.comm.size
    runner.comm.gathered_bytes = 0
    moe.dispatch_rows(h)
    per_token = runner.comm.gathered_bytes // t
    dispatch_ms = _time_ms(lambda: moe.dispatch_rows(h), reps)
    layer_ms = _time_ms(lambda: moe(h), reps)
    rows.add(case="moe", tokens=t, dispatch=dispatch.value, packet_kernels=kernels.value,
             gathered_bytes_per_token=per_token, dispatch_ms=round(dispatch_ms, 3),
             layer_ms=round(layer_ms, 3))


def _prefill_once(forward, cache: ModelCache, t: int) -> tuple[float, object]:
    """(seconds, output) of one fresh T-token prefill of sequence 0 (state reset first)."""
    dev = _device()
    plan = ForwardPlan.build([t], [0], [0], torch.arange(cache.num_pages, device=dev)[None],
                             cache.page_size)
    vocab = cache.cfg.vocab_size
    ids = torch.randint(0, vocab, (t,), generator=torch.Generator().manual_seed(t)).to(dev)
    cache.reset_state(torch.tensor([0], device=dev))
    _sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = forward(ids, plan, cache)
    _sync()
    return time.perf_counter() - start, out


def _bench_prefill_cp1(model: GLM5Model, sizes: list[int], args, rows: _Rows,
                       t0: float) -> tuple[list[int], torch.Tensor | None]:
    """Rank 0 times the plain model; the others wait. Returns the sizes it managed and (rank 0)
    the final hidden states of the first size, to check the CP run against."""
    done, ref = [], None
    if dist.get_rank() == 0:
        for t in sizes:
            if time.perf_counter() - t0 > args.budget_s / 2:
                break
            cache = ModelCache(model.cfg, -(-t // 64) * 64, 1, 64, CacheDtypes(), _device(),
                               with_mtp=False)
            forward = lambda ids, plan, c: model(ids, plan, c)
            runs = [_prefill_once(forward, cache, t) for _ in range(1 + args.prefill_reps)]
            s = statistics.median(secs for secs, _ in runs[1:])
            ref = runs[-1][1][0] if ref is None else ref
            rows.add(case="prefill", tokens=t, cp_ranks=1, moe_dispatch="none (single device)",
                     s_per_prefill=round(s, 4), input_tok_s=round(t / s, 1))
            done.append(t)
            del cache
    box = [done]
    dist.broadcast_object_list(box, src=0)
    return box[0], ref  # rank 0's list, on every rank


def _set_dispatch(runner: CPPrefill, dispatch: MoEDispatch) -> None:
    for layer in runner.model.layers:
        if isinstance(layer.mlp, EPMoE):
            layer.mlp.dispatch = dispatch


def _check_cp_against_cp1(runner: CPPrefill, t: int, ref, rows: _Rows) -> None:
    """The real-width CP run (exact BF16 dispatch) against the single-GPU hidden states."""
    _set_dispatch(runner, MoEDispatch.BF16)
    cache = runner.new_cache(-(-t // 64) * 64, 1, 64, CacheDtypes())
    _, hidden = _prefill_once(runner.hidden, cache, t)
    if ref is not None:
        stats = diff_stats(ref.float(), hidden.float())
        rows.add(case="check", tokens=t, what="CP hidden (bf16 dispatch) vs CP1 hidden",
                 **{k: v for k, v in stats.items() if k != "worst"})


def _bench_prefill_cp(runner: CPPrefill, sizes: list[int], args, rows: _Rows,
                      t0: float) -> None:
    for dispatch in (MoEDispatch.FP8_PACKET, MoEDispatch.BF16_THEN_FP8):
        _set_dispatch(runner, dispatch)
        for t in sizes:
            if not _rank0_says(time.perf_counter() - t0 < args.budget_s):
                return
            cache = runner.new_cache(-(-t // 64) * 64, 1, 64, CacheDtypes())
            runs = [_prefill_once(runner.forward, cache, t) for _ in range(1 + args.prefill_reps)]
            worst = torch.tensor(statistics.median(s for s, _ in runs[1:]), device=_device())
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the step ends when the last rank does
            s = float(worst)
            rows.add(case="prefill", tokens=t, cp_ranks=runner.info.cp_size,
                     tp=runner.info.tp_size, ep=runner.info.ep_size, moe_dispatch=dispatch.value,
                     s_per_prefill=round(s, 4), input_tok_s=round(t / s, 1))
            del cache
