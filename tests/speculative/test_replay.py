"""ReplaySSM and snapshot commits: bitwise equal to the recurrence, and the cache after a commit
equal to having fed only the accepted tokens."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.kda.ref import kda_recurrent_ref, l2norm
from glmlab.model.session import Session
from glmlab.presets import preset_config
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.layout import SessionLayout
from glmlab.speculative.replay import CommitMode, ReplayRing, StateSnapshots, replay_steps
from glmlab.testing.compare import assert_close


def _inputs(n, d, h, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(n, d, h, k, generator=g)) * k**-0.5
    kk = l2norm(torch.randn(n, d, h, k, generator=g))
    v = torch.randn(n, d, h, k, generator=g)
    gate = -torch.rand(n, d, h, k, generator=g) * 2
    beta = torch.rand(n, d, h, generator=g)
    s0 = torch.randn(n, h, k, k, generator=g)
    return q, kk, v, gate, beta, s0


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_replay_is_bitwise_the_recurrence(state_dtype):
    q, k, v, g, beta, s0 = _inputs(5, 8, 2, 16)
    s0 = s0.to(state_dtype)
    steps = torch.tensor([1, 3, 8, 5, 0])
    out = replay_steps(s0, k, v, g, beta, steps)
    for i, c in enumerate(steps.tolist()):
        sl = slice(i, i + 1)
        if c == 0:  # nothing accepted: the state is untouched
            assert torch.equal(out[i], s0[i])
            continue
        _, ref = kda_recurrent_ref(q[sl, :c], k[sl, :c], v[sl, :c], g[sl, :c], beta[sl, :c], s0[sl])
        assert torch.equal(out[i], ref[0].to(state_dtype)), f"request {i}, {c} steps"


def test_ring_and_snapshot_agree_with_the_recurrence():
    cfg = preset_config("tiny")
    h, k = cfg.kda.num_heads, cfg.kda.head_dim
    q, kk, v, g, beta, s0 = _inputs(3, 6, h, k, seed=1)
    layer, slots, lens = cfg.kda_layers[0], torch.tensor([2, 0, 3]), torch.tensor([6, 1, 4])
    ring, snap = ReplayRing(cfg, 4, 6, torch.float32), StateSnapshots(cfg, 4, 6, torch.float32)
    o_ref, _ = kda_recurrent_ref(q, kk, v, g, beta, s0)
    for store in (ring, snap):
        o = store.verify(layer, slots, q, kk, v, g, beta, s0)
        assert torch.equal(o, o_ref)
    rec_ring = torch.zeros(4, h, k, k)
    rec_ring[slots] = s0
    rec_snap = rec_ring.clone()
    ring.commit(layer, rec_ring, slots, slots, lens)
    snap.commit(layer, rec_snap, slots, slots, lens)
    assert torch.equal(rec_ring, rec_snap)


def _run(model, prompt, window, commit_len, mode):
    """Prefill ``prompt`` into sequence 2, verify ``window`` with a recorder, commit
    ``commit_len``. The store has one row, bound to state slot 2."""
    session = Session(model, 3, 64)
    layout = SessionLayout(session)
    session.forward({2: prompt})
    store = SpecStateStore(model.cfg, 1, len(window), mode, torch.float32, num_state_slots=3)
    store.bind([2], [0])
    plan = layout.plan([2], [len(window)], [len(prompt)], verify=store)
    with torch.inference_mode():
        model(torch.tensor(window), plan, session.cache)
        with pytest.raises(ValueError, match="without a speculative row"):
            store.commit(session.cache, torch.tensor([1]), torch.tensor([commit_len]))
        store.commit(session.cache, plan.state_slots, torch.tensor([commit_len]))
    session.lengths[2] = len(prompt) + commit_len
    return session


@pytest.mark.parametrize("mode", list(CommitMode))
@pytest.mark.parametrize("prompt_len,commit_len", [(21, 1), (22, 3), (23, 8), (24, 6)])
def test_commit_equals_feeding_the_accepted_tokens(tiny_model, mode, prompt_len, commit_len):
    cfg = tiny_model.cfg
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
    window = torch.randint(0, cfg.vocab_size, (8,), generator=g).tolist()
    spec = _run(tiny_model, prompt, window, commit_len, mode)
    plain = Session(tiny_model, 1, 64)
    plain.forward({0: prompt})
    plain.forward({0: window[:commit_len]})
    a, b = spec.cache, plain.cache
    for layer in cfg.kda_layers:
        assert_close(f"conv{layer}", b.conv[layer][0], a.conv[layer][2], "fp32_chunk")
        assert_close(f"state{layer}", b.recurrent[layer][0], a.recurrent[layer][2], "fp32_chunk")
    held = (prompt_len + commit_len) % cfg.dsa.index_kpool
    for layer in cfg.dsa_layers:
        assert_close(f"tail{layer}", b.index_tail[layer][0, :held], a.index_tail[layer][2, :held],
                     "fp32_chunk")
    nxt = [7, 9, 11]  # the continuation sees the same cache either way
    assert_close("logits", plain.logits({0: nxt})[0], spec.logits({2: nxt})[0], "fp32_chunk")


@pytest.mark.parametrize("mode", list(CommitMode))
def test_bytes_per_slot_matches_the_buffers(mode):
    cfg = preset_config("tiny")
    store = SpecStateStore(cfg, 3, 8, mode, torch.bfloat16, torch.float32)
    held = [*store.conv_window.values(), *store.index_rows.values()]
    rec = store.recurrence
    held += [*rec.k.values(), *rec.v.values(), *rec.g.values(), *rec.beta.values()] \
        if mode is CommitMode.REPLAY else list(rec.states.values())
    allocated = sum(t.numel() * t.element_size() for t in held) // 3
    want = SpecStateStore.bytes_per_slot(cfg, 8, mode, torch.bfloat16, torch.float32)
    assert want["total"] == allocated


def test_replay_ring_is_smaller_than_snapshots_at_full_width():
    cfg = preset_config("full")
    ring = ReplayRing.bytes_per_slot(cfg, 8, torch.bfloat16)
    snap = StateSnapshots.bytes_per_slot(cfg, 8, torch.bfloat16)
    # 34 layers x 8 steps x 64 heads: (4*128 + 2*128 + 4*128 + 2) B vs 128*128*2 B per head-step
    assert ring == 34 * 8 * 64 * 1282 and snap == 34 * 8 * 64 * 128 * 128 * 2
