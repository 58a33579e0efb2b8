"""The reference deployment's decode and prefill points, measured on one emulated rank (issue 16).

    python -m glmlab.bench.ops --op reference_point --stream rows.jsonl        one H200, full size
    python -m glmlab.bench.ops --op reference_point --rehearsal --tag cpu-rehearsal     CPU, tiny

Rank 0 of the published TP4/EP4 decode instance holds a quarter of the attention heads and 72 of
the 288 experts; running exactly its work on one GPU measures everything but the collectives,
which a stand-in process group records (``glmlab.distributed.standin``) and
``glmlab.distributed.comm_model`` prices (published NVLink 4 NCCL sweeps, or ``--comm-table``
rows measured by ``bench.ops --op comm``). Phases (``--phases``):

- ``decode``: 132 requests over a 64K shared prefix (65,472 tokens stored once, KV-only radix
  layout) with 64-token private suffixes, FP8 KV, BF16 state; DFlash2 block 8 (simulated
  acceptance 7.03), MTP718 (7.37) and plain decode cycles, the verify / decode step replayed from
  CUDA graphs, for each batch of the sweep (``glmlab.bench.reference_decode``);
- ``prefill``: one 64K prompt on rank 0 of interleaved CP4 with FP8 MoE packets
  (``glmlab.bench.reference_prefill``).

Rows (``glmlab.bench.reference_rows``) are labelled ``emulated: true``: the model's outputs are not
its outputs (partial sums stay partial); its times are rank 0's compute.

Memory on one H200 (139 GiB usable), decode: rank 0's FP8 weights ~84 GB (routed experts
42 x 72 x 25.2 MB = 76.1 GB + the MTP layer's 72 = 1.8 GB; embedding and lm_head replicated
2.5 GB; KDA quarter heads 2.4 GB; DSA, dense, shared experts, routers, mHC ~1.4 GB) + the draft
shard 0.5 GB; one unsplit MoE layer is resident while drawing (~20 GB fp32, freed before caches).
Caches for 132 requests: target KV 6,732 B/token (12 DSA stacks incl. MTP, FP8 528 + 33 B) x
(65,472 shared + 132 x 320 private + 64 scratch) ~ 0.73 GB; draft KV 5,120 B/token (5 layers x 2
KV heads x 256 x 2 B) ~ 0.55 GB; KDA state 17.8 MB x 133 slots = 2.4 GB; ReplaySSM store ~1 GB;
CUDA graphs of 8 buckets ~3-5 GB; the draft's chunked context read ~4 GB transient: ~100 GB in
all, so the published pools themselves (14.00 + 11.96 + 7.37 GB) would fit beside the weights too.
Prefill: weights ~82 GB (DSA, dense MLPs and shared experts whole under CP) + 64K-token
activations (KDA gathers [65,536 x 4,096] BF16, MoE packets and grouped rows) ~10-20 GB.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch

from glmlab.bench.ops import machine
from glmlab.bench.reference_decode import WIDTH, DecodeBench, RankSpec, build_rank
from glmlab.bench.reference_layout import SharedPrefix
from glmlab.bench.reference_prefill import PrefillBench, prefill_backends
from glmlab.bench.reference_rows import (
    commit_bytes,
    decode_row,
    draft_bytes,
    memory_rows,
    prefill_row,
    roofline,
    trained_accept,
    verify_bytes,
    verify_flops,
)
from glmlab.cache.storage import CacheDtypes
from glmlab.distributed.comm_model import CommModel
from glmlab.distributed.comm_table import CommTable
from glmlab.distributed.standin import CollectiveRecorder
from glmlab.model.backends import Backends
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.replay import CommitMode

ROOT = Path(__file__).resolve().parents[2]
NOTE = ("EMULATED: rank {rank} of TP{tp}/EP{tp} on one device. Compute measured; outputs are not "
        "the model's (partial sums stay partial); communication modelled from the recorded "
        "collectives.")
TIMING = {"warmup": "--warmup cycles per batch after one eager census cycle",
          "repetitions": "--cycles timed cycles per batch (mean); prefill: one timed step"}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op reference_point")
    p.add_argument("--rehearsal", action="store_true",
                   help="CPU rehearsal: tiny preset, TP2, torch ops, short prefix (labelled)")
    p.add_argument("--phases", default="decode,prefill")
    p.add_argument("--preset", default="full")
    p.add_argument("--tp", type=int, default=4, help="TP = EP of decode, CP of prefill")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backends", choices=("fast", "torch"), default="fast")
    p.add_argument("--algorithms", default="dflash2,mtp,decode")
    p.add_argument("--batches", default=None, help="DFlash2 and plain-decode sweep, the "
                   "reference point first (default 132,1,8,16,32,64,96,128; rehearsal 4,1,2)")
    p.add_argument("--mtp-batches", default=None, help="default 132 (rehearsal 4)")
    p.add_argument("--prefix-len", type=int, default=None, help="default 65,472 (rehearsal 192)")
    p.add_argument("--suffix-len", type=int, default=None, help="default 64 (rehearsal 8)")
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--draft-layers", type=int, default=None, help="default 5 (rehearsal 2)")
    p.add_argument("--draft-kv-heads", type=int, default=0, help="0: draft_shape's (rehearsal 2)")
    p.add_argument("--prefill-tokens", type=int, default=None, help="default 65,536 (reh. 64)")
    p.add_argument("--prefill-warmup", type=int, default=None, help="default 4,096 (reh. 0)")
    p.add_argument("--comm-table", default="", help="measured comm rows (bench.ops --op comm)")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds from start after which later decode points are skipped")
    p.add_argument("--stream", default="", help="append each stamped row here as measured")
    p.add_argument("--profile-dir", default="",
                   help="write the CUDA kernels of one more eager cycle at each algorithm's "
                        "reference point, phase by phase, here (profile-ALGORITHM.txt)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.rehearsal:
        args.preset, args.tp, args.device, args.backends = "tiny", 2, "cpu", "torch"
        args.draft_kv_heads = args.draft_kv_heads or 2
    defaults = REHEARSAL if args.rehearsal else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


FULL = {"batches": "132,1,8,16,32,64,96,128", "mtp_batches": "132", "prefix_len": 65_472,
        "suffix_len": 64, "draft_layers": 5, "prefill_tokens": 65_536, "prefill_warmup": 4096}
REHEARSAL = {"batches": "4,1,2", "mtp_batches": "4", "prefix_len": 192, "suffix_len": 8,
             "draft_layers": 2, "prefill_tokens": 64, "prefill_warmup": 0}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


class _Out:
    """Rows in memory, each also appended (stamped) to the stream file and printed."""

    def __init__(self, stream: str):
        self.rows, self.stream = [], Path(stream) if stream else None
        self.failed: list[str] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        keys = ("phase", "algorithm", "batch", "cycle_ms", "compute_ms", "comm_ms",
                "per_gpu_output_tok_s", "per_gpu_input_tok_s", "accept_len")
        print("EMULATED", json.dumps({k: row[k] for k in keys if k in row}), flush=True)
        if self.stream is not None:
            self.stream.parent.mkdir(parents=True, exist_ok=True)
            with self.stream.open("a") as f:
                f.write(json.dumps({**machine(**TIMING), **row}) + "\n")


def bandwidth(device: str) -> float | None:
    """HBM bytes/s of a device copy (GPU), or of a CPU copy (the rehearsal's roofline)."""
    if device.startswith("cuda"):
        from glmlab.kernels.moe.timing import measure_ceilings

        return measure_ceilings()["hbm_copy_tbs"] * 1e12
    src = torch.randn(1 << 24)
    dst = torch.empty_like(src)
    t = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    return 5 * 2 * src.numel() * 4 / (time.perf_counter() - t)


def _dtypes(model_dtype: torch.dtype) -> CacheDtypes:
    """FP8 latent and pooled keys, BF16 recurrent state (the reference deployment's formats)."""
    return CacheDtypes(latent=torch.float8_e4m3fn, pool_keys=torch.float8_e4m3fn,
                       recurrent=torch.bfloat16, conv=model_dtype, tail=torch.bfloat16)


def _base(args, cfg, backends: Backends, graphs: bool) -> dict:
    return {"bench": "reference_point", "preset": args.preset, "layers": cfg.num_layers,
            "tp": args.tp, "ep": args.tp, "rank": args.rank, "device": args.device,
            "backends": backends.describe(), "cuda_graphs": graphs,
            "kv_formats": "latent fp8, pooled keys fp8, state bf16",
            "cpu_rehearsal": args.rehearsal, "note": NOTE.format(rank=args.rank, tp=args.tp)}


def run_decode(args, comm: CommModel, out: _Out, start: float) -> None:
    fast = args.backends == "fast"
    backends = Backends.fast() if fast else Backends()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    spec = RankSpec(args.preset, args.tp, args.rank, "keep" if fast else "dequantize", dtype,
                    args.device, args.draft_layers, args.draft_kv_heads or None, args.seed)
    rec = CollectiveRecorder()
    t = time.perf_counter()
    model, draft = build_rank(spec, rec)
    model.use_backends(backends)
    print(f"rank {args.rank} of TP{args.tp}/EP{args.tp} drawn in {time.perf_counter() - t:.1f} "
          f"s", flush=True)
    sweeps = {"dflash2": _ints(args.batches), "mtp": _ints(args.mtp_batches),
              "decode": _ints(args.batches)}
    algorithms = args.algorithms.split(",")
    work = SharedPrefix(max(max(sweeps[a]) for a in algorithms), args.prefix_len,
                        args.suffix_len, headroom=(2 + args.warmup + args.cycles) * WIDTH + 64)
    graphs = args.device.startswith("cuda") and fast
    bench = DecodeBench(model, draft, work, _dtypes(model.dtype), rec, graphs, args.seed,
                        profile_dir=args.profile_dir or None)
    hbm = bandwidth(args.device)
    base = {**_base(args, model.cfg, backends, graphs), "prompt_len": work.prompt_len,
            "shared_prefix_len": work.prefix_len, "suffix_len": work.suffix_len,
            "draft": {"layers": draft.cfg.num_layers, "heads_per_rank": draft.cfg.num_heads,
                      "kv_heads_per_rank": draft.cfg.num_kv_heads, "kv_dtype": "bf16"}}
    deadline = start + args.time_budget if args.time_budget else None
    # every algorithm at its reference point first, then the rest of the sweeps, so that a time
    # budget cuts sweep points, not the reference points (each pass captures its own graphs)
    passes = [[(a, sweeps[a][:1]) for a in algorithms], [(a, sweeps[a][1:]) for a in algorithms]]
    for pass_ in passes:
        for algorithm, batches in pass_:
            if not batches:
                continue
            try:  # one algorithm failing (a kernel, memory) must not cost the others their rows
                for res in bench.sweep(algorithm, batches, args.cycles, args.warmup, deadline,
                                       detail_batch=sweeps[algorithm][0]):
                    out.add(_decode_row(args, bench, res, comm, base, hbm))
            except Exception:  # noqa: BLE001 (reported, and raised at the end of the run)
                traceback.print_exc()
                out.failed.append(f"decode {algorithm} {batches}")
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()


def _decode_row(args, bench: DecodeBench, res, comm: CommModel, base: dict,
                hbm: float | None) -> dict:
    model, work, algorithm = bench.model, bench.work, res.algorithm
    parts = {"verify": verify_bytes(model, bench.layout.cache, res.batch,
                                    1 if algorithm == "decode" else WIDTH, work.prompt_len,
                                    res.experts_hit)}
    if algorithm == "dflash2":
        parts["draft"] = draft_bytes(model, bench.draft, bench.draft_kv, res.batch,
                                     work.prompt_len)
    if algorithm != "decode":
        parts["commit"] = commit_bytes(bench.layout.cache, res.batch)
    memory = None
    if res.sublayer_ms is not None:  # the reference point of this algorithm
        memory = memory_rows(bench, _extra_memory(bench, model, args.device))
    width = 1 if algorithm == "decode" else WIDTH
    flops = verify_flops(model, res.batch, width, work.prompt_len)
    return decode_row(res, comm, base, roofline(parts, hbm, flops), memory,
                      trained_accept(ROOT, algorithm))


def _extra_memory(bench: DecodeBench, model, device: str) -> dict[str, int]:
    rows = bench.layout.cache.num_state_slots
    store = SpecStateStore.bytes_per_slot(model.cfg, WIDTH, CommitMode.REPLAY, model.dtype,
                                          torch.bfloat16)["total"] * rows
    extra = {"spec_workspace": store, "cuda_graphs": bench.graph_bytes}
    if device.startswith("cuda"):
        extra["peak_allocated"] = torch.cuda.max_memory_allocated()
    return extra


def run_prefill(args, comm: CommModel, out: _Out) -> None:
    fast = args.backends == "fast"
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    rec = CollectiveRecorder()
    t = time.perf_counter()
    bench = PrefillBench(args.preset, args.tp, args.rank, rec, args.device, dtype,
                         "keep" if fast else "dequantize", _dtypes(dtype), fast, args.seed)
    print(f"CP rank {args.rank} of {args.tp} drawn in {time.perf_counter() - t:.1f} s",
          flush=True)
    base = _base(args, bench.runner.model.cfg, prefill_backends(fast), False)
    tokens = args.prefill_tokens
    while True:
        try:
            res = bench.measure(tokens, args.prefill_warmup)
            break
        except torch.OutOfMemoryError:  # a row at half the prompt beats none (labelled)
            if tokens <= args.prefill_warmup or tokens < 2 * args.tp:
                raise
            print(f"out of memory at {tokens} tokens; trying {tokens // 2}", flush=True)
            torch.cuda.empty_cache()
            tokens //= 2
            out.failed.append(f"prefill at {tokens * 2} tokens (out of memory)")
    out.add({**prefill_row(res, comm, base, None),
             "requested_input_len": args.prefill_tokens})


def run(argv: list[str] | None = None) -> list[dict]:
    args = _args(argv)
    start = time.perf_counter()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no GPU: run with --rehearsal (tiny, CPU) or on an H200")
    table = CommTable.from_file(args.comm_table) if args.comm_table else CommTable.published()
    comm, out = CommModel(table), _Out(args.stream)
    phases = args.phases.split(",")
    if "decode" in phases:
        run_decode(args, comm, out, start)
    if "prefill" in phases:
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        run_prefill(args, comm, out)
    if out.failed:
        raise RuntimeError(f"{len(out.rows)} rows written to the stream; failed: {out.failed}")
    return out.rows
