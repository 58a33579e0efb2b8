"""CPU rehearsal of the decode benchmark's pieces (glmlab/bench/ops_decode.py) on the tiny model:
the cache layout and step plans (decode and a recorded verify window), the roofline accounting,
and both paths' eager steps producing finite, matching logits on the same inputs."""

from __future__ import annotations

import torch

from glmlab.bench import ops_decode
from glmlab.checkpoint.loader import load_model
from glmlab.model.backends import Backends
from glmlab.model.session import run_step
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.replay import CommitMode


def test_plans_roofline_and_both_paths(tiny_dir):
    model = load_model(tiny_dir, dtype=torch.float32)
    cache = ops_decode.build_cache(model, batch=3, context=40, device="cpu")
    plan = ops_decode.step_plan(cache, 3, 40, 1, None, model.cfg.vocab_size)
    f = plan.forward
    assert f.uniform_width == 1 and f.positions.tolist() == [40, 40, 40]
    assert 0 not in f.state_slots.tolist() and int(f.page_table.min()) > 0  # scratch untouched
    hit = ops_decode.experts_hit(model, cache, plan)
    assert set(hit) == {0, 1, 2} and all(1 <= n <= model.cfg.moe.num_experts for n in hit.values())
    parts = ops_decode.roofline_bytes(model, cache, plan, hit)
    # 41 tokens > the tiny top-k: each query reads top-k 16 + tail 3 rows
    assert parts["kv"] == 3 * model.cfg.dsa.max_selected * cache.latent_bytes_per_token()
    assert parts["index"] > 0 and parts["state"] > 0 and parts["experts"] > 0
    lm_head = model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    assert parts["weights"] > lm_head
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
    assert ops_decode.roofline_bytes(model, cache, plan, {})["state"] > 0
