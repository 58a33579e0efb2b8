"""glmlab tune linear-fp8: the block-FP8 dense GEMM's tile configs, timed on this GPU.

The shapes are the FP8 linears a model's fast forward calls (``--preset slice:4`` by default: the
real widths), as they are called: gate|up fused into one GEMM, the DSA attention's q_a|kv_a
down-projection fused, the MLP down-projections fed E4M3 activations by the fused SwiGLU. Each
(N, K) is tuned at every ``--tokens`` M (``glmlab.kernels.fp8.tuner``) and the winners are written
to ``kernels/fp8/configs/linear-fp8-<device>.json`` (``--out``), which ``linear_fp8`` reads from
then on. One report row per (M, N, K) goes to ``--report``: the tuned config and its time beside
the untuned rule's, the weight-streaming rate and the FLOP rate, against the HBM bandwidth and
FP8 matmul rate measured in the same run, and the fastest of each kind beside them: the
tensor-core kernel, the CUDA-core GEMV (M <= 8) and ``torch._scaled_mm``'s block-wise GEMM (or
why this torch refused it). A kind wins a shape only by being timed fastest and matching the
reference; the table then sends ``linear_fp8`` calls of that shape to it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

DEFAULT_TOKENS = (1, 8, 32, 64, 128, 256, 1056, 4096)


def add_parser(sub) -> None:
    p = sub.add_parser("linear-fp8", help="block-FP8 dense GEMM tiles", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="slice:4", help="model whose FP8 linears are tuned")
    p.add_argument("--shapes", help="instead of a preset: NxK list, e.g. 24576x4096,4096x12288:fp8"
                   " (':fp8' = the call passes E4M3 activations)")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="M values")
    p.add_argument("--out", default=None, help="config directory (default: the package's)")
    p.add_argument("--update", action="store_true", help="merge into an existing table")
    p.add_argument("--report", default="data/bench/linear_fp8_tune.jsonl")
    p.set_defaults(_tune=run)


def model_shapes(preset: str) -> list[tuple[int, int, bool]]:
    """(N, K, E4M3 input) of every FP8 GEMM call of the preset's fast forward: the checkpoint's
    FP8 linears, merged as ``fuse_projections`` merges them (gate|up; q_a|kv_a when both fill
    whole 128-row scale blocks), the MLP down-projections fed E4M3 by the fused SwiGLU."""
    from glmlab import presets
    from glmlab.checkpoint.writer import fp8_parameter_names
    from glmlab.config import ModelConfig
    from glmlab.model.glm import GLM5Model
    from glmlab.model.mlp import MLP

    cfg = ModelConfig.from_hf(presets.preset(preset))
    with torch.device("meta"):
        model = GLM5Model(cfg, with_mtp=False)
    mods = dict(model.named_modules())
    calls: dict[tuple[int, int], bool] = {}
    for name in sorted(n.removesuffix(".weight") for n in fp8_parameter_names(model)):
        lin = mods.get(name)
        if lin is None or not hasattr(lin, "out_features"):
            continue  # e.g. expert stacks: the MoE kernels' business
        parent, _, leaf = name.rpartition(".")
        if leaf in ("gate_proj", "up_proj") and isinstance(mods[parent], MLP):
            calls[(2 * lin.out_features, lin.in_features)] = False
        elif leaf == "down_proj" and isinstance(mods[parent], MLP):
            calls[(lin.out_features, lin.in_features)] = True
        elif leaf in ("q_a_proj", "kv_a_proj_with_mqa"):
            a, b = mods[f"{parent}.q_a_proj"], mods[f"{parent}.kv_a_proj_with_mqa"]
            if a.out_features % 128 == 0 and b.out_features % 128 == 0:
                calls[(a.out_features + b.out_features, a.in_features)] = False
            else:
                calls[(lin.out_features, lin.in_features)] = False
        else:
            calls[(lin.out_features, lin.in_features)] = False
    return sorted((n, k, fp8) for (n, k), fp8 in calls.items())


def run(args: argparse.Namespace) -> int:
    from glmlab.bench.ops import write_rows
    from glmlab.kernels.fp8.gemm_configs import (
        CONFIG_DIR,
        GemmTable,
        read_table,
        rule_config,
        save_table,
    )
    from glmlab.kernels.fp8.tuner import tune_shape
    from glmlab.kernels.moe.timing import GraphTimer, measure_ceilings

    if not torch.cuda.is_available():
        raise SystemExit("glmlab tune linear-fp8 times kernels on a GPU")
    shapes = _parse_shapes(args.shapes) if args.shapes else model_shapes(args.preset)
    tokens = [int(t) for t in args.tokens.split(",") if t]
    device = torch.cuda.get_device_name(0)
    ceilings = measure_ceilings()
    timer = GraphTimer()
    out = Path(args.out) if args.out else CONFIG_DIR
    old = read_table(device, out) if args.update else None
    meta = {"tokens": tokens, "timer": "CUDA graph, L2 flushed per call",
            "triton": __import__("triton").__version__}
    entries, rows = {}, []
    for n, k, act_fp8 in shapes:
        for m in tokens:
            res = tune_shape(m, n, k, timer, act_fp8=act_fp8)
            entries.setdefault((n, k), {})[m] = res.best.config
            rule = rule_config(m, n, k)
            rule_us = res.time_of(replace(rule, fuse_quant=False) if act_fp8 else rule)
            w_bytes = n * k + (-(-n // 128)) * (-(-k // 128)) * 4
            row = {"M": m, "N": n, "K": k, "act": "e4m3" if act_fp8 else "bf16",
                   "tuned": res.best.config.short(), "tuned_us": round(res.best.us, 2),
                   "rule": rule.short(), "rule_us": None if rule_us is None else round(rule_us, 2),
                   "speedup_vs_rule": None if rule_us is None else round(rule_us / res.best.us, 2),
                   "weight_tbs": round(w_bytes / res.best.us / 1e6, 3),
                   "frac_hbm": round(w_bytes / res.best.us / 1e6 / ceilings["hbm_copy_tbs"], 3),
                   "tflops": round(2 * m * n * k / res.best.us / 1e6, 1),
                   "frac_fp8_peak": round(2 * m * n * k / res.best.us / 1e6
                                          / ceilings["fp8_scaled_mm_tflops"], 3),
                   **_kind_columns(res),
                   "rel_err": res.best_rel_err, "candidates": len(res.timings),
                   "failed": list(res.failed)[:4], **{k2: round(v, 3) for k2, v in
                                                       ceilings.items()}}
            rows.append(row)
            print(json.dumps({k2: row[k2] for k2 in ("M", "N", "K", "act", "tuned", "tuned_us",
                                                     "rule_us", "frac_hbm", "tflops", "mma_us",
                                                     "gemv_us", "scaled_mm_us")}),
                  flush=True)
        # after every shape: a run cut short keeps the shapes it finished
        table = GemmTable(entries, meta)
        path = save_table(old.merged(table) if old is not None else table, device, out)
        if args.report:
            report = Path(args.report)
            write_rows(rows, report.parent, report.stem, warmup="graph capture + 2 replays",
                       repetitions=f"{timer.replays} graph replays of up to {timer.max_launches}")
            rows = []
    print(json.dumps({"table": str(path), "report": args.report, "shapes": len(shapes)}))
    return 0


def _kind_columns(res) -> dict:
    """The fastest config and time of each kind, and why scaled_mm did not run if it did not."""
    from glmlab.kernels.fp8.gemm_configs import scaled_mm_config

    cols = {}
    for kind in ("mma", "gemv", "scaled_mm"):
        best = res.best_of(kind)
        cols[f"{kind}_us"] = None if best is None else round(best.us, 2)
        if kind != "scaled_mm":
            cols[f"best_{kind}"] = None if best is None else best.config.short()
    cols["scaled_mm_error"] = res.failure_of(scaled_mm_config())
    return cols


def _parse_shapes(spec: str) -> list[tuple[int, int, bool]]:
    out = []
    for item in spec.split(","):
        nk, _, kind = item.partition(":")
        n, k = (int(x) for x in nk.lower().split("x"))
        out.append((n, k, kind == "fp8"))
    return out
