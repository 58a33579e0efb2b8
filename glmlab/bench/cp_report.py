"""What the CP benchmark rows say, next to the reference deployment's prefill ladder (notebook 06,
closing notes).

``summarize(rows)`` turns ``data/bench/cp*.jsonl`` rows (``glmlab.bench.ops_cp``) into the ratios
the issue asks for: packet vs BF16 all-gather bytes and time, MoE layer time per dispatch, CP vs
CP1 prefill input tokens/s. ``REFERENCE_PREFILL_LADDER`` is the reference deployment's table (4 x
H200, 64K input) and
``fp8_comm_estimate`` sizes the slice of its last step that the smaller all-gather alone explains,
from a measured all-gather bandwidth. Pure data in, data out: no torch, no devices.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from glmlab.kernels.fp8.packet_ref import PacketLayout

# (configuration, input tokens/s, what changed): reference deployment section 4, TP4/EP1/CP4, 64K
# in, 10 out.
REFERENCE_PREFILL_LADDER = [
    ("Baseline", 23304.96, "no CP; prefill BCG disabled"),
    ("CP + BCG", 31661.00, "interleaved CP4, CUDA graphs for prefill"),
    ("Execution prep + MoE", 35661.29, "fewer syncs and KV copies; MoE tuning; act+quant fusion"),
    ("32K chunks + Async-TP", 43575.32, "larger prefill batches; KDA input all-gather overlapped"),
    ("DeepGEMM + KDA QKV fuse", 45913.28, "faster experts; fused KDA input preparation"),
    ("FP8 comm + fusion + scheduling", 48064.24, "FP8 MoE packets; reuse quantised values"),
]


def read_rows(paths: list[str | Path]) -> list[dict]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def ladder_steps() -> list[dict]:
    """Each step's gain over the previous one and its share of the total 2.06x."""
    total = REFERENCE_PREFILL_LADDER[-1][1] / REFERENCE_PREFILL_LADDER[0][1]
    out, prev = [], None
    for name, tok_s, what in REFERENCE_PREFILL_LADDER:
        step = tok_s / prev if prev else 1.0
        out.append({"config": name, "input_tok_s": tok_s, "what": what, "step_x": step,
                    "cumulative_x": tok_s / REFERENCE_PREFILL_LADDER[0][1],
                    "share_of_log_gain": math.log(step) / math.log(total)})
        prev = tok_s
    return out


def fp8_comm_estimate(tok_s: float, busbw_gbs: float, cp: int = 4, hidden: int = 4096,
                      top_k: int = 8, moe_layers: int = 42) -> dict:
    """Time share of the BF16 MoE all-gathers at ``tok_s`` and what FP8 packets save of it.

    Each rank receives (cp-1)/cp of every gathered token per MoE layer; at a bus bandwidth of
    ``busbw_gbs`` (ring all-gather) that takes bytes / busbw seconds, not overlapped.
    """
    layout = PacketLayout(hidden, top_k)
    share = (cp - 1) / cp * moe_layers / (busbw_gbs * 1e9)  # seconds per token per byte
    bf16_s, fp8_s = (tok_s * b * share for b in (layout.bf16_bytes_per_token(),
                                                  layout.bytes_per_token))
    return {"bf16_gather_time_share": bf16_s, "fp8_gather_time_share": fp8_s,
            "speedup_if_gather_on_critical_path": (1 - fp8_s) / (1 - bf16_s)
            if bf16_s < 1 else float("nan")}


def summarize(rows: list[dict]) -> dict:
    """Ratios of the CP benchmark: per token count, FP8 over BF16 (bytes, all-gather ms, MoE
    dispatch and layer ms) and CP over CP1 prefill tokens/s."""
    out: dict = {"allgather": {}, "moe": {}, "prefill": {}}
    gathers = [r for r in rows if r.get("case") == "allgather"]
    for t in sorted({r["tokens"] for r in gathers}):
        by = {r["transport"]: r for r in gathers if r["tokens"] == t}
        if {"bf16", "fp8-packet"} <= by.keys():
            b, f = by["bf16"], by["fp8-packet"]
            out["allgather"][t] = {"bf16_ms": b["ms"], "fp8_ms": f["ms"],
                                   "bytes_ratio": f["gathered_bytes"] / b["gathered_bytes"],
                                   "time_ratio": f["ms"] / b["ms"],
                                   "bf16_algbw_gbs": b["algbw_gbs"]}
    moes = [r for r in rows if r.get("case") == "moe"]
    for t in sorted({r["tokens"] for r in moes}):
        out["moe"][t] = {f"{r['dispatch']}/{r['packet_kernels']}":
                         {"dispatch_ms": r["dispatch_ms"], "layer_ms": r["layer_ms"],
                          "bytes_per_token": r["gathered_bytes_per_token"]}
                         for r in moes if r["tokens"] == t}
    pre = [r for r in rows if r.get("case") == "prefill"]
    for t in sorted({r["tokens"] for r in pre}):
        cp1 = [r for r in pre if r["tokens"] == t and r["cp_ranks"] == 1]
        for r in (r for r in pre if r["tokens"] == t and r["cp_ranks"] > 1):
            key = f"{t}/cp{r['cp_ranks']}/{r['moe_dispatch']}"
            out["prefill"][key] = {"input_tok_s": r["input_tok_s"],
                                   "cp1_input_tok_s": cp1[0]["input_tok_s"] if cp1 else None,
                                   "speedup": r["input_tok_s"] / cp1[0]["input_tok_s"]
                                   if cp1 else None}
    return out
