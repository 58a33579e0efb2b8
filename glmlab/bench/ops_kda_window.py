"""KDA window benchmark (``python -m glmlab.bench.ops --op kda-window``): recurrent vs chunk.

One KDA layer's in-place window step (``kernels/decode/kda_window_triton.kda_window``) at real
widths, H = 64 heads of K = V = 128, for (sequences, tokens per sequence) in ``--cases``
(default: a verify step of 132 x 8 and of 16 x 8, a decode step of 128 x 1). Each case runs the
step-by-step ``recurrent`` kernel and the matrix-form ``chunk`` kernel (``kda_window_chunk_triton``,
for each ``--chunk-block-v``) on the same inputs: q, k, g fp32, v, beta, gate bf16, the state in
``--state-dtype``, written back on decode (n = 1) only, as a verify step leaves it alone.

Rows: ``us`` (median, ``triton.testing.do_bench``), ``bytes`` the step must move (states read,
and written when stored; q, k, g, v, beta, gate and slots read; the output written), their rate
and its fraction of the HBM copy and read rates measured in the same run
(``kernels.moe.timing.measure_ceilings``), ``floor_us`` (bytes over the copy rate),
``x_recurrent`` (the recurrent kernel's time over this one's) and ``max_diff_vs_recurrent`` (max
absolute difference of the outputs). Calls rotate over disjoint slot sets covering at least
256 MB of state, so a small case's states do not stay in L2 between calls. GPU only.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from glmlab.bench.ops import bench_us

TIMING = {"warmup": "do_bench 25 ms", "repetitions": "do_bench 100 ms, median"}
ROTATE_BYTES = 256 << 20


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op kda-window")
    p.add_argument("--cases", default="132x8,16x8,128x1", help="SEQSxN, comma separated")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dim", type=int, default=128, help="K = V")
    p.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--chunk-block-v", default="auto",
                   help="value columns per chunk program, comma separated (auto: the default)")
    p.add_argument("--recurrent-block-v", default="auto",
                   help="value columns per recurrent program, comma separated (auto: "
                        "value_block's pick; the first is the baseline of x_recurrent)")
    p.add_argument("--recurrent-warps", default="auto",
                   help="warps per recurrent program, comma separated, each timed with every "
                        "recurrent value block (auto: kda_window's default)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _cases(s: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in c.split("x")) for c in s.split(",") if c]


def window_bytes(n_seq: int, n: int, heads: int, dk: int, dv: int, state_bytes: int,
                 store_state: bool, act_bytes: int = 2) -> int:
    """What one step must read and write: the states (read; written too when stored), q, k, g
    (fp32), v, beta, gate (activation dtype) and the slots, and the output."""
    t = n_seq * n
    state = n_seq * heads * dk * dv * state_bytes * (2 if store_state else 1)
    inputs = t * heads * (3 * dk * 4 + (2 * dv + 1) * act_bytes) + n_seq * 8 + dv * act_bytes
    return state + inputs + t * heads * dv * act_bytes


def _inputs(n_seq, n, heads, d, state_dtype, seed):
    from glmlab.kernels.kda.ref import l2norm

    g = torch.Generator(device="cuda").manual_seed(seed)
    t, bf = n_seq * n, torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    q = l2norm(randn(t, heads, d)) * d**-0.5
    k = l2norm(randn(t, heads, d))
    gg = -5 * torch.sigmoid(2 * randn(t, heads, d) - 2)
    v, beta = randn(t, heads, d).to(bf), torch.sigmoid(randn(t, heads)).to(bf)
    per_seq = heads * d * d * state_dtype.itemsize
    sets = max(1, -(-ROTATE_BYTES // (n_seq * per_seq)))
    state = (randn(sets * n_seq, heads, d, d) * 0.05).to(state_dtype)
    perm = torch.randperm(sets * n_seq, device="cuda", generator=g)
    slot_sets = [perm[i * n_seq:(i + 1) * n_seq].contiguous() for i in range(sets)]
    gate, nw = randn(t, heads * d).to(bf), (randn(d) * 0.1 + 1).to(bf)
    return q, k, v, gg, beta, state, slot_sets, gate, nw


def _time(kda_window, inputs, pristine, store, method, bv,
          warps=None) -> tuple[float, torch.Tensor]:
    """(median us of the step rotating over the slot sets, the output of one call from the
    ``pristine`` states: the timed calls of a storing case move ``state`` on, so every variant's
    output must start from the same copy for their difference to mean anything)."""
    q, k, v, g, beta, state, slot_sets, gate, nw = inputs
    rotate = itertools.cycle(slot_sets)

    def step():
        return kda_window(q, k, v, g, beta, state, next(rotate), gate, nw, 1e-5, store,
                          block_v=bv, method=method, num_warps=warps)

    out = kda_window(q, k, v, g, beta, pristine.clone(), slot_sets[0], gate, nw, 1e-5, store,
                     block_v=bv, method=method, num_warps=warps)
    return bench_us(step, warmup=25, rep=100), out


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the kda-window benchmark needs a GPU")
    from glmlab.kernels.decode.kda_window_chunk_triton import chunk_value_block
    from glmlab.kernels.decode.kda_window_triton import kda_window, value_block
    from glmlab.kernels.moe.timing import measure_ceilings

    ceil = measure_ceilings()
    copy_tbs, read_tbs = ceil["hbm_copy_tbs"], ceil["hbm_read_tbs"]
    gpu, d, heads = torch.cuda.get_device_name(0), args.dim, args.heads
    sdt = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
    rows: list[dict] = []
    for n_seq, n in _cases(args.cases):
        store = n == 1
        inputs = _inputs(n_seq, n, heads, d, sdt, args.seed)
        pristine = inputs[5].clone()
        warps = [None if w == "auto" else int(w) for w in args.recurrent_warps.split(",")]
        variants = [("recurrent", value_block(d, d, n_seq, heads) if bv == "auto" else int(bv),
                     w) for bv in args.recurrent_block_v.split(",") for w in warps]
        variants += [("chunk", chunk_value_block(d, d) if bv == "auto" else int(bv), None)
                     for bv in args.chunk_block_v.split(",") if bv]  # "": no chunk form
        nbytes = window_bytes(n_seq, n, heads, d, d, sdt.itemsize, store)
        base_us = base_out = None
        for method, bv, w in variants:
            us, out = _time(kda_window, inputs, pristine, store, method, bv, w)
            if base_us is None:
                base_us, base_out = us, out
            row = {"op": "kda-window", "gpu": gpu, "seqs": n_seq, "n": n, "heads": heads,
                   "dk": d, "dv": d, "state_dtype": args.state_dtype, "store_state": store,
                   "method": method, "block_v": bv, "num_warps": w, "us": round(us, 2),
                   "bytes": nbytes,
                   "tbs": round(nbytes / us / 1e6, 3), "hbm_copy_tbs": round(copy_tbs, 3),
                   "hbm_read_tbs": round(read_tbs, 3),
                   "frac_hbm_copy": round(nbytes / us / 1e6 / copy_tbs, 3),
                   "frac_hbm_read": round(nbytes / us / 1e6 / read_tbs, 3),
                   "floor_us": round(nbytes / copy_tbs / 1e6, 2),
                   "x_recurrent": round(base_us / us, 2),
                   "max_diff_vs_recurrent": float((out.float() - base_out.float()).abs().max())}
            print(row, flush=True)
            rows.append(row)
        del inputs
        torch.cuda.empty_cache()
    return rows
