"""Rows of the reference-point benchmark: measured compute, modelled communication, published.

Every row is labelled ``emulated: true`` (one rank's compute on one device; its outputs are not
the model's) and carries: the cycle split into phases (compute measured), the communication the
rank recorded priced by ``glmlab.distributed.comm_model`` (source named), their sum (no overlap)
and the perfect-overlap bound, per-GPU throughput and TPOT from the sum, a memory roofline per
phase (bytes a phase must move / HBM bandwidth measured in the same run), memory per pool, and
the reference deployment's published figures for the same point (``REFERENCE``; its phases from
``glmlab.speculative.costs``, its pools from ``glmlab.cache.budget_report``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from glmlab.bench.reference_restate import BASIS
from glmlab.cache.budget import GIB, plan_budget
from glmlab.cache.budget_report import REFERENCE_POOLS, reference_final
from glmlab.distributed.comm_model import CommModel, overlap_bounds
from glmlab.model.layers import Linear
from glmlab.model.moe import Experts
from glmlab.speculative.costs import REFERENCE as REFERENCE_CYCLES

# The reference deployment (docs/reference-numbers.md section 0): 4 x H200, TP4/EP4 decode at
# 64K/1K with a 99.9% shared prefix, 132 running requests; TP4/EP1/CP4 prefill at 64K/10.
REFERENCE = {
    "decode": {"gpus": 4, "output_tok_s": 12026.62, "per_gpu_output_tok_s": 12026.62 / 4,
               "mean_tpot_ms": 10.07, "running_requests": 132, "cycle_ms": 74.14,
               "accept_len": 7.03},
    "prefill": {"gpus": 4, "input_tok_s": 48064.24, "per_gpu_input_tok_s": 48064.24 / 4,
                "mean_ttft_s": 2.72, "input_len": 65536},
}
CYCLE_NAME = {"dflash2": "DFlash2-B8", "mtp": "MTP718"}
# the published decode ladder: (configuration, running-request limit, output tok/s on 4 GPUs)
REFERENCE_LADDER = [("capacity-adjusted baseline", 56, 2781.88), ("FP8 KV cache", 96, 3881.60),
                    ("FP8 KV + MTP516", 56, 5625.32), ("+ ReplaySSM, BF16 state", 88, 7721.79),
                    ("+ KV-only decode radix", 128, 9529.15),
                    ("DFlash2 + tuned MoE + DSA Partial", 132, 12026.62)]
GOAL = {"per_gpu_output_tok_s": 3007, "stretch": 3300, "cycle_ms": 74.0,
        "per_gpu_input_tok_s": 12016}
TRAINED_ACCEPT = "data/bench/spec-accept-small-h200.jsonl"


def trained_accept(root: Path, algorithm: str) -> float | None:
    """Measured acceptance at width 8, greedy, of the trained small model (when its rows exist)."""
    path = root / TRAINED_ACCEPT
    if algorithm not in ("dflash2", "mtp") or not path.exists():
        return None
    for line in path.read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if (r.get("algorithm") == algorithm and r.get("verify_width") == 8
                and not r.get("temperature")):
            return r.get("accept_len")
    return None


# ---------------------------------------------------------------------- bytes and roofline
def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the parameters, buffers and tensor attributes (FP8 scales) of ``module``, each
    storage counted once (fused projections leave their parts as views of the merged weight)."""
    seen, total = set(), 0
    for m in module.modules():
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False),
                  *(v for v in vars(m).values() if isinstance(v, torch.Tensor))):
            storage = t.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes()) if t.device.type != "meta" else id(t)
            if key not in seen:
                seen.add(key)
                total += storage.nbytes() if t.device.type != "meta" else _nbytes(t)
    return total


def verify_bytes(model, cache, batch: int, width: int, context: int,
                 hits: dict[int, int] | None) -> dict[str, int]:
    """Bytes one target step over ``batch`` x ``width`` tokens must move, by part: every weight
    it uses (routed experts only where a token went), the latent rows and pooled keys it reads,
    the KDA state it reads (and writes, when not verifying), the fp32 logits it writes."""
    cfg, t = model.cfg, batch * width
    experts = [m for m in model.layers.modules() if isinstance(m, Experts)]
    per_expert = [sum(_nbytes(x) for x in (m.w13, m.w2, m.w13_scale, m.w2_scale))
                  // m.w13.shape[0] for m in experts]
    routed = sum((hits or {}).get(i, m.w13.shape[0]) * per_expert[i]
                 for i, m in enumerate(experts))
    dense = weight_bytes(model.layers) - sum(weight_bytes(m) for m in experts)
    dense += weight_bytes(model.norm) + weight_bytes(model.lm_head)
    dense += t * cfg.hidden_size * model.embed_tokens.weight.element_size()
    dsa = len(cfg.dsa_layers)
    per_layer_latent = cache.latent_bytes_per_token() // len(cache.latent)
    rows = min(context + width, width * cfg.dsa.max_selected)
    state = sum(_nbytes(x[0]) for x in (*cache.recurrent.values(), *cache.conv.values()))
    return {"weights": dense, "experts": routed,
            "kv": batch * rows * per_layer_latent * dsa,
            "index": int(batch * (context + width) * cache.index_bytes_per_token()
                         * dsa / len(cache.latent)),
            "state": batch * state * (1 if width > 1 else 2),
            "logits": t * cfg.vocab_size * 4}


PEAK_TFLOPS = {"fp8": 1979.0, "bf16": 989.0}  # H200 SXM dense tensor-core peaks (spec)


def verify_flops(model, batch: int, width: int, context: int, hits_rows: float | None = None
                 ) -> dict[str, float]:
    """Tensor-core FLOPs of one target step by precision: every Linear of the layers (FP8 where
    the weight is) and the lm_head for every row; routed experts for this rank's share of the
    token-expert rows (uniform routing unless ``hits_rows`` says); sparse MLA over the selected
    rows (QK and PV in the 512-wide latent) and the KDA delta rule (BF16)."""
    cfg, t = model.cfg, batch * width
    fp8 = bf16 = 0.0
    for m in model.layers.modules():
        if isinstance(m, Linear):
            f = 2.0 * t * m.in_features * m.out_features
            fp8, bf16 = (fp8 + f, bf16) if m.is_fp8 else (fp8, bf16 + f)
    bf16 += 2.0 * t * cfg.hidden_size * cfg.vocab_size  # lm_head
    experts = [m for m in model.layers.modules() if isinstance(m, Experts)]
    for m in experts:
        local = m.w13.shape[0] / cfg.moe.num_experts
        rows = hits_rows if hits_rows is not None else t * cfg.moe.top_k * local
        f = 2.0 * rows * (m.w13[0].numel() + m.w2[0].numel())
        fp8, bf16 = (fp8 + f, bf16) if m.w13_scale is not None else (fp8, bf16 + f)
    d, k = cfg.dsa, cfg.kda
    sel = min(context + width, d.max_selected)
    bf16 += len(cfg.dsa_layers) * 4.0 * t * d.num_heads * sel * d.kv_lora_rank
    bf16 += len(cfg.kda_layers) * 8.0 * t * k.num_heads * k.head_dim * k.head_dim
    return {"fp8": fp8, "bf16": bf16,
            "floor_ms": (fp8 / PEAK_TFLOPS["fp8"] + bf16 / PEAK_TFLOPS["bf16"]) / 1e9}


def draft_bytes(model, draft, draft_kv, batch: int, context: int) -> dict[str, int]:
    """DFlash2 block forward: draft weights, every context row's draft K/V, the lm_head."""
    b = draft.cfg.block_size
    return {"weights": weight_bytes(draft) + weight_bytes(model.lm_head),
            "draft_kv": batch * (context + b) * draft_kv.layout.bytes_per_token,
            "logits": batch * (b - 1) * model.cfg.vocab_size * 4}


def commit_bytes(cache, batch: int) -> dict[str, int]:
    """ReplaySSM commit: each request's KDA state read, advanced over its accepted steps,
    written back."""
    state = sum(_nbytes(x[0]) for x in cache.recurrent.values())
    return {"state": 2 * batch * state}


def roofline(parts: dict[str, dict[str, int]], hbm_bytes_s: float | None,
             flops: dict[str, float] | None = None) -> dict:
    """Per phase: bytes / measured bandwidth; the verify's tensor-core floor at the H200's
    dense peaks beside it (``flops``); the cycle's roofline is the larger of the two for the
    verify plus the memory time of the other phases."""
    out = {"bytes": {p: int(sum(v.values())) for p, v in parts.items()},
           "parts": parts, "hbm_tbs": None if hbm_bytes_s is None else hbm_bytes_s / 1e12}
    if flops is not None:
        out["verify_flops"] = {k: v for k, v in flops.items() if k != "floor_ms"}
        out["verify_compute_floor_ms"] = flops["floor_ms"]
    if hbm_bytes_s:
        out["ms"] = {p: b / hbm_bytes_s * 1e3 for p, b in out["bytes"].items()}
        verify = max(out["ms"].get("verify", 0.0), out.get("verify_compute_floor_ms", 0.0))
        out["cycle_ms"] = verify + sum(v for p, v in out["ms"].items() if p != "verify")
    return out


def memory_rows(bench, extra: dict[str, int]) -> dict:
    """GB per pool of the emulated run beside the published per-GPU budget and glmlab's own
    budget of the reference configuration (KV-only radix: one state slot per request)."""
    cache = bench.layout.cache
    kv = bench.layout.kv_bytes()
    state = sum(_nbytes(x) for x in (*cache.recurrent.values(), *cache.conv.values(),
                                      *cache.index_tail.values()))
    ours = {"weights": weight_bytes(bench.model), "draft_weights": weight_bytes(bench.draft),
            "target_kv": kv["allocated"], "target_kv_shared_prefix": kv["shared_prefix"],
            "draft_kv": bench.draft_kv.nbytes, "state": state, **extra}
    budget = plan_budget(reference_final(slots_per_request=1))
    pub = REFERENCE_POOLS["final"]
    return {"gb": {k: round(v / 1e9, 3) for k, v in ours.items()},
            "reference_gb": {"target_kv": pub["target KV"], "draft_kv": pub["draft KV"],
                             "state": pub["recurrent + conv state"],
                             "state_slots": pub["state slots"]},
            "glmlab_budget_gb": {"target_kv": round(budget.kv_bytes / GIB, 2),
                                 "draft_kv": round(budget.draft_kv_bytes / GIB, 2),
                                 "state": round(budget.state_bytes / GIB, 2),
                                 "max_running": budget.max_running_requests}}


# ---------------------------------------------------------------------- rows
def decode_row(res, comm: CommModel, base: dict, roof: dict, memory: dict | None,
               trained: float | None) -> dict:
    priced = comm.price(res.calls)
    compute, comm_ms = res.compute_ms, priced["comm_ms"]
    bounds = overlap_bounds(compute, comm_ms)
    cycle = bounds["no_overlap_ms"]
    # the TP ranks run the same requests together: one cycle gives batch x accept tokens for
    # all of them, so a GPU's share is that over the TP size (the published 3,007 per GPU is
    # 12,027 over four)
    out_tokens = res.batch * res.accept_len / base["tp"]
    ref = REFERENCE_CYCLES.get(CYCLE_NAME.get(res.algorithm, ""))
    row = {**base, "emulated": True, "phase": "decode", "algorithm": res.algorithm,
           "batch": res.batch, "accept_len": round(res.accept_len, 4),
           "accept_simulated": res.algorithm != "decode", "trained_accept_len": trained,
           "cycle_ms": round(cycle, 3), "compute_ms": round(compute, 3),
           "comm_ms": round(comm_ms, 3),
           "phase_ms": {k: round(v, 3) for k, v in res.phase_ms.items()},
           "comm_ms_by_phase": {k: round(v, 3) for k, v in priced["by_phase"].items()},
           "collectives": priced["by_kind"], "comm_sources": priced["sources"],
           "per_gpu_output_tok_s": round(out_tokens / cycle * 1e3, 1), "per_gpu_basis": BASIS,
           "tpot_ms": round(cycle / res.accept_len, 3),
           "cycle_ms_full_overlap": round(bounds["full_overlap_ms"], 3),
           "per_gpu_output_tok_s_full_overlap": round(
               out_tokens / bounds["full_overlap_ms"] * 1e3, 1),
           "cycles": res.cycles, "roofline": roof, "sublayer_ms": res.sublayer_ms,
           "reference": {**REFERENCE["decode"],
                         **({"cycle": {"draft_ms": ref.draft_ms, "verify_ms": ref.verify_ms,
                                       "rest_ms": round(ref.rest_ms, 2),
                                       "cycle_ms": ref.cycle_ms, "accept_len": ref.accept_len}}
                            if ref else {})}}
    if memory is not None:
        row["memory"] = memory
    if res.algorithm == "dflash2" and res.batch == REFERENCE["decode"]["running_requests"]:
        row["goal"] = {**{k: GOAL[k] for k in ("per_gpu_output_tok_s", "stretch", "cycle_ms")},
                       "met": row["per_gpu_output_tok_s"] >= GOAL["per_gpu_output_tok_s"]
                       and cycle <= GOAL["cycle_ms"]}
    return row


def prefill_row(res, comm: CommModel, base: dict, roof: dict | None) -> dict:
    priced = comm.price(res.calls)
    step = res.step_ms + priced["comm_ms"]
    per_gpu = res.tokens / res.cp / step * 1e3  # cp ranks share one prompt's tokens
    return {**base, "emulated": True, "phase": "prefill", "algorithm": "cp-prefill",
            "batch": 1, "input_len": res.tokens, "cp": res.cp, "moe_dispatch": "fp8-packet",
            "cycle_ms": round(step, 3), "compute_ms": round(res.step_ms, 3),
            "comm_ms": round(priced["comm_ms"], 3), "collectives": priced["by_kind"],
            "comm_sources": priced["sources"],
            "per_gpu_input_tok_s": round(per_gpu, 1),
            "per_gpu_input_tok_s_full_overlap": round(
                res.tokens / res.cp / max(res.step_ms, priced["comm_ms"]) * 1e3, 1),
            "sublayer_ms": res.sublayer_ms, "warmup_tokens": res.warmup_tokens,
            "roofline": roof, "reference": REFERENCE["prefill"],
            "goal": {"per_gpu_input_tok_s": GOAL["per_gpu_input_tok_s"],
                     "met": per_gpu >= GOAL["per_gpu_input_tok_s"]}}
