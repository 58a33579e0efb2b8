"""DSA kernel benchmark (sparse MLA generations, SGLang's kernels, the indexer) and notebook views.

    python -m glmlab.bench.ops_dsa --out DIR [--shapes 1056x16,8192x64] [--sglang FILE] [--quick]
    python -m glmlab.bench.ops --op dsa ...        # same rows, written once at the end

One run measures, on the same inputs and beside ceilings measured in the same process (HBM device
copy, bf16 and fp8 matmul): for each shape M x H (query rows x heads) and KV layout (bf16, raw
FP8, scaled FP8), the sparse-MLA Partial (+ Combine) of every variant: the dispatch rule's pick,
each second-generation schedule, the first-generation kernel under its own rule (``v1``), and
SGLang 0.5.23's TileLang kernels (``sglang``: loaded from its module file, see
``glmlab.kernels.dsa.peers``; bf16 rows, and raw FP8 rows for both FP8 layouts since it reads no
scales). Index lists are 2051 wide (2048 top-k + 3 tail) padded with -1 to 2112. Rows carry
kernel time, TFLOP/s (4 M H 2051 R), gathered bytes/s (what the CTAs read: M x head groups x 2051
x bytes per row), the unique rows' bytes, fractions of the measured peaks, the error against the
torch reference on the first rows, and speedups against ``v1`` and ``sglang``. A ``best`` row per
shape names the fastest variant and whether the rule picked it: the input for re-deriving
``dispatch.choose_block``. The indexer (FP8 scores over 16K pools = 64K tokens + top-512 + tail)
gets rows for private contexts and for one shared prefix.

Workloads: decode-like shapes (M <= 2048) are requests of ``rows_per_request`` rows (a verify
block) sharing one index list over a private ``context``-token context; prefill-like shapes give
every row its own list over one ``prefill_context``-token context (random, with repeats).
Every case is guarded: a variant that fails to build or run writes an ``error`` row and the run
goes on. With ``--out`` each row is appended (stamped, ``glmlab.bench.ops.write_rows``) as soon as
it is measured.

Beside this module: ``ops_dsa_workload`` (index widths, workloads, torch reference, timer,
ceilings), ``ops_dsa_indexer`` (the indexer's rows) and ``ops_dsa_views`` (the notebook's views).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch

# The notebook (04_dsa_kernels) reads its views through this module.
from glmlab.bench.ops_dsa_views import (  # noqa: E402, F401
    RESULTS,
    load_results,
    markdown_table,
    record_tiny_selection,
    reference_check,
    reference_iteration_table,
    rule_table,
    selection_figure,
    variant_speedups,
)
from glmlab.bench.ops_dsa_workload import (
    INDEX_WIDTH,
    PADDED_WIDTH,
    RANK,
    SCALE,
    TIMING,
    make_workload,
    measure_ceilings,
    time_us,
    torch_reference,
)
from glmlab.kernels.dsa.dispatch import (
    ALL_SCHEDULES,
    GpuArch,
    Schedule,
    choose_block,
    choose_block_v1,
    choose_block_v2,
    tile_iterations,
)
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout

CHECK_ROWS = 64  # rows compared with the torch reference in every case


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops_dsa")
    p.add_argument("--shapes", default="1056x16,128x16,8192x16,8192x64,32768x16,32768x64",
                   help="MxH query rows x heads")
    p.add_argument("--layouts", default="bf16,fp8_raw,fp8_scaled")
    p.add_argument("--variants", default="rule,v2,ws1c-s2,ws1c-s3,ws1c-s2-q4,wspv,v1,sglang",
                   help="rule (this rule's pick), v2 (the round-2 rule's pick: the previous "
                        "version), v1 (first generation), ws1c-sS[-q4], wspv, ws, pipelined, "
                        "pipelined-t256, sglang")
    p.add_argument("--disable", default="",
                   help="schedules the rule must not pick (their GPU tests failed), e.g. ws1c")
    p.add_argument("--sglang", default="", help="sglang's dsa/tilelang_kernel.py (peer)")
    p.add_argument("--context", type=int, default=16384, help="tokens per decode request")
    p.add_argument("--prefill-context", type=int, default=65536)
    p.add_argument("--rows-per-request", type=int, default=8)
    p.add_argument("--indexer-rows", default="1056")
    p.add_argument("--skip-indexer", action="store_true")
    p.add_argument("--quick", action="store_true", help="shorter timing loops")
    p.add_argument("--out", default="", help="append rows here as they are measured")
    p.add_argument("--precompile-only", action="store_true",
                   help="build every kernel the run and tests/kernels/dsa need, then stop")
    p.add_argument("--warm-sglang-only", action="store_true",
                   help="compile the SGLang peer's kernels for --shapes, then stop")
    return p.parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _shapes(s: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in x.split("x")) for x in s.split(",") if x]


class Sink:
    """Rows kept for the caller and, with an output folder, appended to it at once."""

    def __init__(self, out: str):
        self.rows: list[dict] = []
        self.out = Path(out) if out else None

    def add(self, row: dict) -> None:
        self.rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                          for k, v in row.items() if not k.startswith("ceiling")}), flush=True)
        if self.out is not None:
            from glmlab.bench.ops import write_rows

            write_rows([row], self.out, "dsa", **TIMING)


# ---------------------------------------------------------------------------------- variants
def enabled_schedules(disable: str) -> frozenset:
    """``--disable ws1c,wspv`` -> the schedules the rule may pick."""
    return ALL_SCHEDULES - {Schedule(x) for x in disable.split(",") if x}


def our_configs(arch: GpuArch, lay: MlaKVLayout, m: int, h: int, names: list[str],
                enabled: frozenset = ALL_SCHEDULES) -> dict:
    """Variant name -> SparseMlaConfig of our kernels for one shape (``rule`` first). Variants
    of a disabled schedule are left out."""
    from glmlab.kernels.dsa.sparse_mla_gen3 import ws1c_builds

    out = {"rule": choose_block(arch, lay, m, h, enabled=enabled)} if "rule" in names else {}
    if "v2" in names:
        out["v2"] = choose_block_v2(arch, lay, m, h)
    sixteen = h % 64 != 0
    for name in names:
        if name.startswith("ws1c-") and sixteen and Schedule.WS1C in enabled:
            stages, qk = int(name.split("-")[1][1:]), 4 if name.endswith("-q4") else 1
            if ws1c_builds(lay, stages, qk):
                out[name] = choose_block(arch, lay, m, h, schedule=Schedule.WS1C, stages=stages,
                                         qk_chunks=qk)
    if "wspv" in names and not sixteen and Schedule.WSPV in enabled:
        out["wspv"] = choose_block(arch, lay, m, h, schedule=Schedule.WSPV)
    if "ws" in names and not sixteen:  # 64-head CTAs only (sparse_mla_ws)
        out["ws"] = choose_block(arch, lay, m, h, schedule=Schedule.WS)
    if lay.format is KVFormat.BF16:  # the pipelined kernel reads bf16 rows only
        if "pipelined" in names:
            out["pipelined"] = choose_block(arch, lay, m, h, schedule=Schedule.PIPELINED)
        if "pipelined-t256" in names and sixteen:  # 16-head CTAs with eight warps
            out["pipelined-t256"] = choose_block(arch, lay, m, h, schedule=Schedule.PIPELINED,
                                                 threads=256)
    if "v1" in names:
        out["v1"] = choose_block_v1(arch, lay, m, h)
    seen, unique = set(), {}
    for name, cfg in out.items():  # the rule's pick is timed once, under "rule"
        if cfg not in seen:
            seen.add(cfg)
            unique[name] = cfg
    return unique


def _our_case(sm, q2, kv, lay, idx, cfg, quick):
    m, h, _ = q2.shape
    po = torch.empty(m, cfg.num_splits, h, RANK, dtype=torch.float32, device="cuda")
    pl = torch.empty(m, cfg.num_splits, h, dtype=torch.float32, device="cuda")

    def call():
        sm.launch_partial(q2, kv, lay, idx, cfg, po, pl)
        return sm.sparse_mla_combine(po, pl)[0]

    out = call()[:CHECK_ROWS].clone()
    return out, time_us(call, quick)


def _sglang_case(peer_mod, q, kv_peer, idx, quick):
    from glmlab.kernels.dsa.peers import sglang_sparse_fwd

    qp = q if kv_peer.dtype == torch.bfloat16 else q.to(kv_peer.dtype)  # sglang casts q itself
    call = lambda: sglang_sparse_fwd(peer_mod, qp, kv_peer, idx, SCALE)
    out = call()[0, :CHECK_ROWS].float()
    return out, time_us(call, quick)


def _row(base: dict, variant: str, us: float, err: float, groups: int, lay, unique_rows: int,
         ceilings: dict, **extra) -> dict:
    m, h = base["rows"], base["heads"]
    flops = 4.0 * m * h * INDEX_WIDTH * RANK
    gathered = m * groups * INDEX_WIDTH * lay.bytes_per_token
    tflops, gather_tbps = flops / us / 1e6, gathered / us / 1e6
    return {**base, "variant": variant, "kernel_us": us, "tflops": tflops,
            "gather_tbps": gather_tbps, "unique_kv_tbps": unique_rows * lay.bytes_per_token / us
            / 1e6, "frac_bf16_peak": tflops / ceilings["ceiling_bf16_tflops"],
            "frac_hbm_gathered": gather_tbps / ceilings["ceiling_hbm_tbps"],
            "rel_err_vs_ref": err, **extra, **ceilings}


def bench_shape(sm, peer_mod, m: int, h: int, lay: MlaKVLayout, work, args, ceilings, arch,
                sink: Sink) -> None:
    q, latent, idx, unique_rows = work
    kv = lay.pack(latent)
    ref = torch_reference(q[:CHECK_ROWS], kv, lay, idx[:CHECK_ROWS])
    err = lambda out: float((out.float() - ref).norm() / ref.norm())
    base = {"op": "sparse_mla", "rows": m, "heads": h, "layout": lay.format.value,
            "index_width": INDEX_WIDTH, "padded_width": PADDED_WIDTH,
            "workload": "prefill" if m > 2048 else f"decode-{args.rows_per_request}-rows-share"}
    names = args.variants.split(",")
    enabled = enabled_schedules(args.disable)
    rule = choose_block(arch, lay, m, h, enabled=enabled)
    previous = choose_block_v2(arch, lay, m, h)
    times, configs = {}, {}
    q2 = sm.prescale_queries(q, SCALE)
    for variant, cfg in our_configs(arch, lay, m, h, names, enabled).items():
        configs[variant] = cfg
        extra = {"config": cfg.name, "splits": cfg.num_splits, "rule_pick": cfg == rule,
                 "tile_iterations": tile_iterations(PADDED_WIDTH, cfg.block_i)}
        try:
            out, us = _our_case(sm, q2, kv, lay, idx, cfg, args.quick)
        except Exception as e:  # one variant failing must not end the run
            sink.add({**base, "variant": variant, **extra, "error": _err(e)})
            continue
        times[variant] = us
        sink.add(_row(base, variant, us, err(out), -(-h // cfg.heads_per_cta), lay, unique_rows,
                      ceilings, **extra))
    if "sglang" in names and peer_mod is not None:
        peer_lay = MlaKVLayout(KVFormat.BF16 if lay.format is KVFormat.BF16
                               else KVFormat.FP8_RAW, RANK)
        kv_peer = kv if peer_lay == lay else peer_lay.pack(latent)
        groups = 1 if peer_lay.format is KVFormat.BF16 and h <= 64 else -(-h // 16)
        extra = {"config": "sglang-0.5.23-tilelang", "peer_layout": peer_lay.format.value}
        try:
            out, us = _sglang_case(peer_mod, q, kv_peer, idx, args.quick)
            ref_peer = ref if peer_lay == lay else torch_reference(q[:CHECK_ROWS], kv_peer,
                                                                   peer_lay, idx[:CHECK_ROWS])
            times["sglang"] = us
            sink.add(_row(base, "sglang", us, float((out - ref_peer).norm() / ref_peer.norm()),
                          groups, peer_lay, unique_rows, ceilings, **extra))
        except Exception as e:
            sink.add({**base, "variant": "sglang", **extra, "error": _err(e)})
        del kv_peer
    if times:
        best = min(times, key=times.get)
        ours = {k: v for k, v in times.items() if k != "sglang"}
        best_ours = min(ours, key=ours.get) if ours else ""
        prev = [k for k, c in configs.items() if c == previous and k in times]
        sink.add({**base, "op": "sparse_mla_best", "best": best, "best_us": times[best],
                  "best_ours": best_ours,
                  "best_ours_config": configs[best_ours].name if best_ours in configs else "",
                  "previous": previous.name,
                  "speedup_rule_over_previous": times[prev[0]] / times["rule"]
                  if prev and "rule" in times else float("nan"),
                  "speedup_best_ours_over_sglang": times.get("sglang", float("nan"))
                  / ours.get(best_ours, float("nan")),
                  "rule": rule.name, "rule_is_best": times.get("rule") == times[best],
                  "rule_vs_best": times.get("rule", float("nan")) / times[best],
                  "speedup_rule_over_v1": times.get("v1", float("nan"))
                  / times.get("rule", float("nan")),
                  "speedup_rule_over_sglang": times.get("sglang", float("nan"))
                  / times.get("rule", float("nan")),
                  "times_us": times})
    del kv


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:400] + " | " + traceback.format_exc(limit=3)[-400:]


def bench_sparse_mla(args, ceilings: dict, arch: GpuArch, sink: Sink) -> None:
    from glmlab.kernels.dsa import sparse_mla_tilelang as sm

    peer_mod = None
    if "sglang" in args.variants.split(","):
        try:
            from glmlab.kernels.dsa.peers import load_sglang_kernels

            peer_mod = load_sglang_kernels(args.sglang)
        except Exception as e:
            sink.add({"op": "sparse_mla", "variant": "sglang", "error": _err(e)})
    layouts = [MlaKVLayout(KVFormat(x), RANK) for x in args.layouts.split(",")]
    t0 = time.perf_counter()
    enabled = enabled_schedules(args.disable)
    jobs = [(lay, cfg) for m, h in _shapes(args.shapes) for lay in layouts
            for cfg in our_configs(arch, lay, m, h, args.variants.split(","), enabled).values()]
    try:
        print(f"compiled {sm.precompile(jobs)} kernels in {time.perf_counter() - t0:.1f} s",
              flush=True)
    except Exception as e:  # compile again one by one inside each case: failures stay local
        sink.add({"op": "sparse_mla", "variant": "precompile", "error": _err(e)})
    for m, h in _shapes(args.shapes):
        prefill = args.prefill_context if m > 2048 else 0
        work = make_workload(m, h, args.context, args.rows_per_request, prefill_context=prefill)
        for lay in layouts:
            bench_shape(sm, peer_mod, m, h, lay, work, args, ceilings, arch, sink)
        del work
        torch.cuda.empty_cache()


def precompile_everything(args, arch: GpuArch) -> int:
    """Build (in parallel, into TileLang's disk cache) the kernels of this run and of the GPU
    tests, so that later processes only load them."""
    from glmlab.kernels.dsa import sparse_mla_tilelang as sm
    from glmlab.kernels.dsa.dispatch import SparseMlaConfig
    from glmlab.kernels.dsa.sparse_mla_gen3 import ws1c_builds

    layouts = [MlaKVLayout(KVFormat(x), RANK) for x in args.layouts.split(",")]
    jobs = {(lay, cfg) for m, h in _shapes(args.shapes) for lay in layouts
            for cfg in our_configs(arch, lay, m, h, args.variants.split(","),
                                   enabled_schedules(args.disable)).values()}
    for fmt in KVFormat:  # the test grid (tests/kernels/dsa/test_sparse_mla_tilelang.py)
        lay = MlaKVLayout(fmt, RANK)
        grid = [SparseMlaConfig(32, 16, 1, 128), SparseMlaConfig(128, 64, 1, 256),
                SparseMlaConfig(64, 64, 1, 384, Schedule.WS, 2),
                SparseMlaConfig(64, 64, 1, 384, Schedule.WSPV, 2)]
        grid += [SparseMlaConfig(64, 16, 1, 256, Schedule.WS1C, st, qk)
                 for st, qk in ((2, 1), (3, 1), (2, 4), (3, 4)) if ws1c_builds(lay, st, qk)]
        if fmt is KVFormat.BF16:
            grid += [SparseMlaConfig(64, 16, 1, t, Schedule.PIPELINED, 2) for t in (128, 256)]
            grid.append(SparseMlaConfig(64, 64, 1, 256, Schedule.PIPELINED, 2))
        jobs.update((lay, cfg) for cfg in grid)
    for rank in (32, 64):
        jobs.add((MlaKVLayout(KVFormat.FP8_SCALED, rank), SparseMlaConfig(32, 16, 1, 128)))
    return sm.precompile(sorted(jobs, key=repr))


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    sink = Sink(args.out)
    arch = GpuArch.current()
    if args.warm_sglang_only:
        from glmlab.kernels.dsa.peers import load_sglang_kernels, warm_sglang

        for line in warm_sglang(load_sglang_kernels(args.sglang), _shapes(args.shapes)):
            print(line, flush=True)
        return []
    if args.precompile_only:
        t0 = time.perf_counter()
        print(f"built {precompile_everything(args, arch)} kernels in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        return []
    ceilings = measure_ceilings(args.quick)
    print("ceilings:", {k: round(v, 2) for k, v in ceilings.items()}, flush=True)
    if not args.skip_indexer:
        for m in _ints(args.indexer_rows):
            from glmlab.bench.ops_dsa_indexer import bench_indexer

            bench_indexer(m, args.quick, ceilings, sink, time_us, _err)
    bench_sparse_mla(args, ceilings, arch, sink)
    return sink.rows


def main(argv: list[str] | None = None) -> int:
    import sys

    rows = run(sys.argv[1:] if argv is None else argv)
    errors = [r for r in rows if "error" in r]
    print(f"{len(rows)} rows, {len(errors)} with errors", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
