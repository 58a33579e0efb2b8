"""Kernel-by-kernel device time of one fused decode / verify step (issue 15's remaining time).

    python scripts/profile_decode_step.py --preset slice:4 --cases 128x1,132x8 [--context 1024]

Prints, per case, the torch profiler's CUDA kernels by total device time (GPU only)."""
from __future__ import annotations

import argparse

import torch

from glmlab.bench import ops_decode
from glmlab.model.backends import Backends
from glmlab.model.session import run_step
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.replay import CommitMode

p = argparse.ArgumentParser()
p.add_argument("--preset", default="slice:4")
p.add_argument("--cases", default="128x1,132x8")
p.add_argument("--context", type=int, default=1024)
a = p.parse_args()
model = ops_decode.build_model(a.preset, 0).use_backends(Backends.fast())
cases = [tuple(int(x) for x in c.split("x")) for c in a.cases.split(",")]
cache = ops_decode.build_cache(model, max(b for b, _ in cases), a.context)
for batch, width in cases:
    rec = None if width == 1 else SpecStateStore(model.cfg, batch + 2, width, CommitMode.REPLAY,
                                                 torch.bfloat16, device="cuda")
    plan = ops_decode.step_plan(cache, batch, a.context, width, rec, model.cfg.vocab_size)
    for _ in range(2):
        run_step(model, cache, plan)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_step(model, cache, plan)
        torch.cuda.synchronize()
    print(f"=== batch {batch} width {width} context {a.context}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
