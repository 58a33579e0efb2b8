"""Tables for looking at MoE routing, padding, tuning and benchmark results (notebook 03).

Plain lists of dicts from routing samples and the JSONL files under ``data/bench/``: expert load
against uniform gating, the rows a BLOCK_SIZE_M alignment computes for real and uniform routes,
the tuned-vs-default-vs-torch table with roofline fractions, and the M = 1024 comparison with the
the reference deployment's figure. Nothing here plots or times anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import torch

from glmlab.kernels.moe.samples import (
    RoutingSamples,
    local_ids,
    padded_rows,
    routes_for_m,
    uniform_routes,
)

# The reference deployment post's M1024 tuning (docs/reference-numbers.md section 1): 11,112 ->
# 11,459 output
# tok/s (+3.12%).
REFERENCE_M1024 = {"before_tok_s": 11112, "after_tok_s": 11459, "gain": 0.0312,
              "conditions": "4xH200 TP4/EP4 (E=72 per rank), DFlash2 block8, ~128 requests, "
                            "end-to-end output throughput"}


def read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def expert_load(samples: RoutingSamples, seed: int = 0) -> dict:
    """Pairs per expert, sorted from the busiest, for the samples and for uniform gating of the
    same number of tokens; plus the max/mean imbalance of each."""
    real = samples.expert_load().sort(descending=True).values
    tokens = sum(s.ids.shape[0] for s in samples.samples)
    uni = torch.bincount(uniform_routes(samples.num_experts, samples.top_k, tokens, 1, seed)[0]
                         .reshape(-1), minlength=samples.num_experts).sort(descending=True).values
    return {"real": real.tolist(), "uniform": uni.tolist(),
            "imbalance_real": float(real.max() / real.float().mean()),
            "imbalance_uniform": float(uni.max() / uni.float().mean())}


def padding_table(samples: RoutingSamples, tokens: list[int], block_ms: list[int],
                  num_local: int | None = None, routes: int = 4) -> list[dict]:
    """Rows computed per BLOCK_SIZE_M (real pairs padded per expert) for real and uniform routes.

    ``num_local``: the experts of EP rank 0 (default: all). ``waste`` = padded / real - 1.
    """
    local = num_local or samples.num_experts
    out = []
    for m in tokens:
        real = [local_ids(r, 0, local) for r in routes_for_m(samples, m, routes, seed=m)]
        uni = [local_ids(r, 0, local)
               for r in uniform_routes(samples.num_experts, samples.top_k, m, routes, seed=m)]
        for bm in block_ms:
            for kind, rs in (("real", real), ("uniform", uni)):
                rows = [padded_rows(r, local, bm) for r in rs]
                pairs, padded = mean(p for p, _ in rows), mean(q for _, q in rows)
                out.append({"M": m, "block_m": bm, "routes": kind, "pairs": pairs,
                            "rows": padded, "waste": padded / max(pairs, 1e-9) - 1})
    return out


def bench_table(rows: list[dict], num_experts: int) -> list[dict]:
    """One line per M: tuned / default / torch times, ratios and roofline fractions (tuned)."""
    cases: dict[int, dict] = {}
    for r in rows:
        if r.get("op") == "moe" and r.get("E") == num_experts and "us" in r:
            cases.setdefault(r["M"], {})[r["variant"]] = r
    out = []
    for m in sorted(cases):
        v = cases[m]
        t = v["triton_tuned"]
        line = {"M": m, "pairs": t["pairs"], "experts_touched": t["experts_touched"],
                "tuned_us": t["us"], "default_us": v["triton_default"]["us"],
                "speedup_vs_default": v["triton_default"]["us"] / t["us"],
                "weight_tbs": t["weight_tbs"], "tflops": t["tflops"], "frac_hbm": t["frac_hbm"],
                "frac_fp8": t["frac_fp8"], "roofline_frac": t["roofline_frac"],
                "config": f"{t['tuned_up']} / {t['tuned_down']}"}
        for peer in ("torch_grouped", "torch_loop"):
            if "us" in v.get(peer, {}):
                line[f"{peer}_us"] = v[peer]["us"]
                line[f"speedup_vs_{peer}"] = v[peer]["us"] / t["us"]
        out.append(line)
    return out


def tune_table(rows: list[dict], num_experts: int) -> list[dict]:
    """The tuning report for one E (the last row per M wins: refinements come later)."""
    last = {r["M"]: r for r in rows if r.get("E") == num_experts and "train_us" in r}
    keys = ("M", "pairs_real", "rows_padded", "up", "down", "train_us", "default_train_us",
            "speedup_train", "speedup_heldout", "heldout_gap", "numerics_relerr", "configs_timed",
            "kept_default")
    return [{k: last[m].get(k) for k in keys} for m in sorted(last)]


def m1024_comparison(bench_rows: list[dict], tune_rows: list[dict]) -> list[dict]:
    """Our M = 1024 kernel-level tuned-vs-default gains beside the reference's end-to-end gain."""
    out = [{"what": "reference deployment: M1024 tuning, end-to-end output tok/s",
            "gain": REFERENCE_M1024["gain"],
            "conditions": REFERENCE_M1024["conditions"]}]
    for e in (288, 72):
        bench = [b for b in bench_table(bench_rows, e) if b["M"] == 1024]
        tune = [t for t in tune_table(tune_rows, e) if t["M"] == 1024]
        if bench:
            out.append({"what": f"glmlab: routed-expert MoE kernels, E={e}, benchmark route",
                        "gain": bench[0]["speedup_vs_default"] - 1,
                        "conditions": "1 H200, tuned vs default config, CUDA graphs, L2 flushed"})
        if tune:
            out.append({"what": f"glmlab: up+down GEMMs, E={e}, held-out routes",
                        "gain": tune[0]["speedup_heldout"] - 1,
                        "conditions": "tuner's held-out validation (other routing samples)"})
    return out


# Kernel families of ``glmlab.bench.ops_moe`` rows, new first; SGLang is the reference column.
FAMILIES = ("glmlab_gluon", "glmlab_grouped", "glmlab_previous", "sglang", "torch_block_loop",
            "torch_grouped_block")


def kernel_comparison(rows: list[dict]) -> list[dict]:
    """GEMM for GEMM (``op == "gemm"``, per projection) and whole MoE (``op == "moe"``): per
    (E, M, proj) the fastest row of each kernel family (its config named), its FP8 TFLOP/s,
    fractions of the in-run FP8 peak and HBM, and time / SGLang's time (< 1: faster than it).
    What each row includes is in the rows' ``includes`` field (e.g. our gate_up also does the
    SwiGLU + requant; SGLang's writes bf16)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r.get("op") not in ("gemm", "moe") or r.get("us") is None:
            continue
        fam = r["variant"].removesuffix("_best")
        key = (r["op"], r["E"], r["M"], r.get("proj", "all"), fam)
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    out = []
    for (op, e, m, proj, fam), r in sorted(best.items(), key=lambda kv: (
            kv[0][0], -kv[0][2], -kv[0][1], kv[0][3],
            FAMILIES.index(kv[0][4]) if kv[0][4] in FAMILIES else 99)):
        sg = best.get((op, e, m, proj, "sglang"))
        out.append(dict(op=op, E=e, M=m, proj=proj, kernel=fam, config=r.get("config"),
                        us=round(r["us"], 1), tflops=round(r["tflops"]),
                        frac_fp8=round(r["frac_fp8"], 3), frac_hbm=round(r["frac_hbm"], 3),
                        x_sglang=round(r["us"] / sg["us"], 3) if sg else None))
    return out
