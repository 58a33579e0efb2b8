"""The block-FP8 dense GEMM compiles for Hopper (sm_90) on a CPU machine, for each program shape
``choose_config`` picks at decode, verify and prefill sizes: E4M3 wgmma, shared memory in budget;
and the CUDA-core GEMV as the rule shapes it at 1 and 4 tokens, in both quantisation placements.

Runs the real Triton compiler (not the interpreter) in a subprocess without TRITON_INTERPRET.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = """
import json
from dataclasses import replace
from glmlab.kernels.fp8.aot import compile_linear_fp8
from glmlab.kernels.fp8.gemm_configs import choose_config, gemv_rule


out = []
for m, n, k in ((8, 8192, 4096), (64, 24576, 4096), (128, 4096, 16384), (4096, 8192, 4096)):
    cfg = choose_config(m, n, k)
    c = compile_linear_fp8(cfg, residual=m == 8)
    out.append(dict(name=cfg.short(), kind=cfg.kind, swap=cfg.swap_ab, split=cfg.split_k,
                    shared=c.shared, wgmma=c.uses_wgmma, e4m3="e4m3" in c.ptx,
                    atomics="atom." in c.ptx))
for m, n, k in ((1, 4096, 16384), (4, 24576, 4096)):
    for fuse in (True, False):
        cfg = replace(gemv_rule(m, n, k), fuse_quant=fuse)
        c = compile_linear_fp8(cfg, residual=m == 1)
        out.append(dict(name=cfg.short(), kind=cfg.kind, swap=False, split=cfg.split_k,
                        shared=c.shared, wgmma=c.uses_wgmma, e4m3="e4m3" in c.ptx,
                        atomics="atom." in c.ptx))
print(json.dumps(out))
"""


def test_linear_fp8_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    mma = [r for r in rows if r["kind"] == "mma"]
    gemv = [r for r in rows if r["kind"] == "gemv"]
    assert any(r["swap"] for r in mma) and any(not r["swap"] for r in mma) and len(gemv) == 4
    for r in rows:
        assert r["e4m3"], r  # E4M3 operands: wgmma inputs, or the GEMV's converts to fp32
        assert r["wgmma"] == (r["kind"] == "mma"), r  # the GEMV stays on the CUDA cores
        assert r["shared"] <= 232448, r
        assert r["atomics"] == (r["split"] > 1), r  # the ticket reduction only when split
