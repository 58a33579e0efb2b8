"""CPU rehearsal of the decode benchmark's pieces (glmlab/bench/ops_decode.py) on the tiny model:
the cache layout and step plans (decode and a recorded verify window), the roofline accounting,
and both paths' eager steps producing finite, matching logits on the same inputs."""

from __future__ import annotations

import torch

from glmlab.bench import ops_decode
from glmlab.checkpoint.loader import load_model
from glmlab.model.backends import Backends
from glmlab.model.layers import Linear
from glmlab.model.session import run_step
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.replay import CommitMode

CEIL = {"hbm": 4.0e12, "bf16": 7.5e14, "fp8": 1.3e15}  # H200-like rates


def test_plans_roofline_and_both_paths(tiny_dir):
    model = load_model(tiny_dir, dtype=torch.float32)
    cache = ops_decode.build_cache(model, batch=3, context=40, device="cpu")
    plan = ops_decode.step_plan(cache, 3, 40, 1, None, model.cfg.vocab_size)
    f = plan.forward
    assert f.uniform_width == 1 and f.positions.tolist() == [40, 40, 40]
    assert 0 not in f.state_slots.tolist() and int(f.page_table.min()) > 0  # scratch untouched
    hit = ops_decode.experts_hit(model, cache, plan)
    assert set(hit) == {0, 1, 2} and all(1 <= n <= model.cfg.moe.num_experts for n in hit.values())
    parts = ops_decode.roofline(model, cache, plan, hit, CEIL)
    nbytes = {k: p["bytes"] for k, p in parts.items()}
    # 41 tokens > the tiny top-k: each query reads top-k 16 + tail 3 rows; the indexer scores
    # every pool's key
    d = model.cfg.dsa
    attn_layers = len(model.cfg.layer_types) - len(model.cfg.kda_layers)
    assert nbytes["attention"] == (3 * d.max_selected * cache.latent_bytes_per_token()
                                   + 3 * 41 * cache.index_bytes_per_token())
    assert nbytes["state"] > 0 and nbytes["experts"] > 0
    lm_head = model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    assert nbytes["weights"] > lm_head
    # FLOPs: every linear over the 3 rows, each query against its selected rows
    linears = sum(2 * 3 * m.in_features * m.out_features for name, m in model.named_modules()
                  if isinstance(m, Linear) and not name.startswith("mtp."))  # no MTP in a step
    assert parts["weights"]["flops"] == linears
    assert parts["attention"]["flops"] >= attn_layers * 2 * 3 * d.num_heads * d.max_selected \
        * 2 * d.kv_lora_rank
    # each part's floor is the larger of its two times, named by its bound
    for p in parts.values():
        t_hbm = p["bytes"] / CEIL["hbm"] * 1e3
        assert p["ms"] >= t_hbm and (p["bound"] == "hbm") == (p["ms"] == t_hbm)
    # both paths on identical cache contents
    snapshot = {k: t[0].clone() for k, t in cache.regions().items()}
    ref = run_step(model.use_backends(Backends()), cache, plan).logits
    for k, t in cache.regions().items():
        t[0].copy_(snapshot[k])
    fast = run_step(model.use_backends(Backends.triton()), cache, plan).logits
    assert torch.isfinite(fast).all()
    assert (fast - ref).norm() / ref.norm() < 1e-4


def test_verify_plan_with_recorder(tiny_dir):
    model = load_model(tiny_dir, dtype=torch.float32).use_backends(Backends.triton())
    cache = ops_decode.build_cache(model, batch=2, context=30, device="cpu")
    store = SpecStateStore(model.cfg, 4, 8, CommitMode.REPLAY, torch.float32)
    plan = ops_decode.step_plan(cache, 2, 30, 8, store, model.cfg.vocab_size)
    out = run_step(model, cache, plan)
    assert out.logits.shape == (16, model.cfg.vocab_size) and torch.isfinite(out.logits).all()
    parts = ops_decode.roofline(model, cache, plan, {}, CEIL)
    # a verify window reads the state and leaves it (the commit writes it): half decode's bytes
    decode = ops_decode.roofline(model, cache, ops_decode.step_plan(
        cache, 2, 30, 1, None, model.cfg.vocab_size), {}, CEIL)
    conv = 2 * 2 * len(model.cfg.kda_layers) * model.cfg.kda.conv_channels \
        * (model.cfg.kda.conv_kernel - 1) * 2
    assert parts["state"]["bytes"] - conv == (decode["state"]["bytes"] - conv) // 2 > 0
