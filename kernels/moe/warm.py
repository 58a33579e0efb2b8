"""Compile every MoE kernel variant the benchmark launches, in parallel processes, before it runs.

Triton compiles a kernel on its first launch (2-7 s each for the grouped GEMMs, a few dozen
variants); one process compiles them one after another. ``warm(jobs)`` starts ``jobs`` worker
processes (``python -m glmlab.kernels.moe.warm i/N``), each launching its share of the variants
once on a 4-expert problem at the real widths (D 4096, I from the argument), so the launches hit
the same specialisations as the benchmark and the compiled binaries land in Triton's on-disk
cache, which the benchmark and the GPU tests then read. A worker that crashes (a compiler abort)
only loses its share. Knows nothing about timing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def tasks(intermediate: int, tokens: tuple[int, ...], experts: tuple[int, ...]) -> list[tuple]:
    """(kind, payload) per distinct launch the benchmark makes."""
    from glmlab.kernels.moe import peers
    from glmlab.kernels.moe.configs import MoEShape, choose_config, read_table
    from glmlab.kernels.moe.fused_grouped import (
        GLUON_CANDIDATES,
        GLUON_DECODE_CANDIDATES,
        GROUPED_CANDIDATES,
        choose_grouped,
    )

    # warp-specialised variants are left to the benchmark's own process (a Triton abort there
    # would take this worker's whole share)
    out = [("grouped", proj, cfg) for proj, cfgs in GROUPED_CANDIDATES.items() for cfg in cfgs
           if not cfg.warp_specialize]
    for e in experts:
        table = read_table(MoEShape(e, 8, 4096, intermediate), "NVIDIA H200")
        for m in tokens:
            out += [("grouped", proj, cfg)
                    for proj, cfg in zip(("up", "down"), choose_grouped(m, e, 8), strict=True)]
            out.append(("previous", choose_config(m, table)))
    wheel = peers.find_wheel(".")
    if wheel:
        import triton

        for e in experts:
            *tables, _ = peers.sglang_configs(wheel, e, intermediate, "NVIDIA H200",
                                              triton.__version__)
            for m in tokens:
                sg = peers.SGLangMoE(None, *tables, m)
                out.append(("sglang", (tuple(sg.up_cfg.items()), sg.up_tma),
                            (tuple(sg.down_cfg.items()), sg.down_tma)))
    out += [("gluon", proj, cfg) for cands in (GLUON_CANDIDATES, GLUON_DECODE_CANDIDATES)
            for proj, cfgs in cands.items() for cfg in cfgs]
    return list(dict.fromkeys(out))


def _run_share(share: int, count: int, intermediate: int, tokens, experts) -> None:
    from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
    from glmlab.kernels.moe import peers
    from glmlab.kernels.moe.configs import MoEShape
    from glmlab.kernels.moe.fused_grouped import up_config_for
    from glmlab.kernels.moe.fused_moe import fused_moe
    from glmlab.kernels.moe.grouped_gluon import GluonConfig, gluon_down, gluon_up
    from glmlab.kernels.moe.grouped_gluon_decode import gluon_decode_down, gluon_decode_up
    from glmlab.kernels.moe.grouped_triton import grouped_down, grouped_up
    from glmlab.kernels.moe.permute_triton import gather_quant
    from glmlab.kernels.moe.routing_triton import align_pairs
    from glmlab.kernels.moe.tuner import Problem

    mine = tasks(intermediate, tokens, experts)[share::count]
    p = Problem.random(MoEShape(4, 8, 4096, intermediate), "cuda")
    x, w = p.activations(64, seed=0)
    ids = torch.randint(0, 4, (64, 8), device="cuda", dtype=torch.int32)
    xq, xs = quant_act_fp8_triton(x)
    module = None
    for task in mine:
        try:
            if task[0] == "grouped":
                _, proj, cfg = task
                al = align_pairs(ids, 4, cfg.block_m)
                a, a_s = (xq, xs) if cfg.gather_a else gather_quant(x, al)
                h8, hs = grouped_up(a if proj == "up" else xq, a_s if proj == "up" else xs,
                                    p.w13, p.w13_scale, al,
                                    cfg if proj == "up" else up_config_for(cfg.block_m),
                                    p.limit)
                if proj == "down":
                    grouped_down(h8, hs, p.w2, p.w2_scale, w, al, cfg, torch.bfloat16)
            elif task[0] == "gluon":
                _, proj, cfg = task
                al = align_pairs(ids, 4, cfg.block_m)
                a, a_s = gather_quant(x, al)
                up, down = (gluon_up, gluon_down) if isinstance(cfg, GluonConfig) else \
                    (gluon_decode_up, gluon_decode_down)
                if proj == "up":
                    up(a, a_s, p.w13, p.w13_scale, al, cfg, p.limit)
                else:
                    h8, hs = grouped_up(xq, xs, p.w13, p.w13_scale, al,
                                        up_config_for(cfg.block_m), p.limit)
                    down(h8, hs, p.w2, p.w2_scale, w, al, cfg, torch.bfloat16)
            elif task[0] == "previous":
                fused_moe(x, ids, w, p.w13, p.w2, p.limit, p.w13_scale, p.w2_scale,
                          configs=task[1])
            else:
                module = module or peers.load_sglang(peers.find_wheel("."))
                sg = peers.SGLangMoE(module, None, None, 1)
                (up, sg.up_tma), (down, sg.down_tma) = task[1], task[2]
                sg.up_cfg, sg.down_cfg = dict(up), dict(down)
                al = align_pairs(ids, 4, sg.up_cfg["BLOCK_SIZE_M"])
                h = sg.up(xq, xs, p.w13, p.w13_scale, w, ids, al)
                y8, ys = quant_act_fp8_triton(sg.act(h, ids, al, p.limit))
                if sg.down_tma:
                    sg.down(y8, ys, p.w2, p.w2_scale, w, ids, al)
                else:
                    y = torch.zeros(ids.numel(), y8.shape[1], device="cuda").to(y8.dtype)
                    sg.down(y, torch.ones(ids.numel(), ys.shape[1], device="cuda"), p.w2,
                            p.w2_scale, w, ids, al)
            torch.cuda.synchronize()
        except Exception as exc:  # reported; the benchmark records its own error later
            print(f"warm: {task[0]} failed: {type(exc).__name__}: {exc}"[:300], flush=True)


def warm(jobs: int, intermediate: int, tokens: tuple[int, ...], experts: tuple[int, ...],
         timeout_s: float) -> int:
    """Run ``jobs`` workers; returns how many exited cleanly."""
    arg = f"{intermediate}:{','.join(map(str, tokens))}:{','.join(map(str, experts))}"
    procs = [subprocess.Popen([sys.executable, "-m", "glmlab.kernels.moe.warm", f"{i}/{jobs}",
                               arg], env=os.environ.copy()) for i in range(jobs)]
    ok = 0
    for proc in procs:
        try:
            ok += proc.wait(timeout=timeout_s) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
    return ok


if __name__ == "__main__":
    share, count = (int(v) for v in sys.argv[1].split("/"))
    inter, toks, exps = sys.argv[2].split(":")
    _run_share(share, count, int(inter), tuple(int(t) for t in toks.split(",")),
               tuple(int(e) for e in exps.split(",")))
