"""ReplaySSM and snapshot commits: bitwise equal to the recurrence (the Triton replay kernel: up
to fp32 summation order), and the cache after a commit equal to having fed only the accepted
tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from glmlab.kernels.decode.ref import kda_replay_ref
from glmlab.kernels.kda.ref import kda_recurrent_ref, l2norm
from glmlab.model.backends import Backends
from glmlab.model.session import Session
from glmlab.presets import preset_config
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.cycle import SpecDecoder
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


def test_kernel_reference_is_replay_steps():
    """``kernels/decode/ref.py:kda_replay_ref`` (what the Triton commit is tested against) and
    this module's ``replay_steps`` are the same commit, bitwise."""
    _, k, v, g, beta, s0 = _inputs(4, 6, 2, 16, seed=4)
    slots, rows, lens = torch.tensor([3, 0, 5, 1]), torch.tensor([2, 0, 3, 1]), torch.tensor(
        [6, 0, 2, 1])
    recurrent = torch.randn(6, 2, 16, 16)
    recurrent[slots] = s0
    want = recurrent.clone()
    want[slots] = replay_steps(recurrent[slots], k[rows], v[rows], g[rows], beta[rows], lens)
    kda_replay_ref(recurrent, slots, rows, k, v, g, beta, lens)
    assert torch.equal(recurrent, want)


@pytest.mark.parametrize("state_dtype,act_dtype", [(torch.float32, torch.float32),
                                                   (torch.bfloat16, torch.bfloat16)])
def test_ring_commit_with_the_kernel_equals_the_torch_path(state_dtype, act_dtype):
    cfg = preset_config("tiny")
    h, dk = cfg.kda.num_heads, cfg.kda.head_dim
    _, k, v, g, beta, _ = _inputs(4, 6, h, dk, seed=2)
    layer = cfg.kda_layers[1]
    # ring rows unrelated to the state slots; slot 2 is not committed, slot 4 accepts nothing
    slots, rows, lens = torch.tensor([5, 0, 4, 3]), torch.tensor([1, 3, 0, 2]), torch.tensor(
        [6, 1, 0, 3])
    rings = {impl: ReplayRing(cfg, 4, 6, act_dtype, commit_impl=impl)
             for impl in ("torch", "triton")}
    before = (torch.randn(6, h, dk, dk, generator=torch.Generator().manual_seed(9)) * 0.1
              ).to(state_dtype)
    states = {}
    for impl, ring in rings.items():
        ring.record(layer, rows, k, v, g, beta)
        states[impl] = before.clone()
        ring.commit(layer, states[impl], slots, rows, lens)
    # fp32: summation order only; bf16: one ulp (2^-7) where the two fp32 results round apart
    tol = 1e-5 if state_dtype == torch.float32 else 2**-7
    assert torch.allclose(states["triton"].float(), states["torch"].float(), rtol=tol, atol=1e-6)
    for untouched in (1, 2, 4):
        assert torch.equal(states["triton"][untouched], before[untouched])
    with pytest.raises(ValueError, match="commit_impl"):
        ReplayRing(cfg, 4, 6, act_dtype, commit_impl="cuda")


@pytest.mark.parametrize("kda_step,want", [("torch", "torch"), ("triton", "triton")])
def test_decoder_commits_with_the_kernel_on_the_fused_kda_step(kda_step, want):
    cfg = preset_config("tiny")
    model = SimpleNamespace(cfg=cfg, dtype=torch.float32, backends=Backends(kda_step=kda_step),
                            embed_tokens=SimpleNamespace(weight=torch.zeros(1)))
    cache = SimpleNamespace(num_state_slots=3, dtypes=SimpleNamespace(recurrent=torch.float32))
    drafter = SimpleNamespace(width=4)
    decoder = SpecDecoder(model, SimpleNamespace(cache=cache), drafter)
    assert decoder.store.commit_impl == decoder.store.recurrence.commit_impl == want
    assert decoder.store.kernel_commit == (want == "triton")


def _run(model, prompt, window, commit_len, mode, commit_impl="torch"):
    """Prefill ``prompt`` into sequence 2, verify ``window`` with a recorder, commit
    ``commit_len``. The store has one row, bound to state slot 2."""
    session = Session(model, 3, 64)
    layout = SessionLayout(session)
    session.forward({2: prompt})
    store = SpecStateStore(model.cfg, 1, len(window), mode, torch.float32, num_state_slots=3,
                           commit_impl=commit_impl)
    store.bind([2], [0])
    plan = layout.plan([2], [len(window)], [len(prompt)], verify=store)
    with torch.inference_mode():
        model(torch.tensor(window), plan, session.cache)
        if not store.kernel_commit:  # the kernel path skips the host-syncing checks
            with pytest.raises(ValueError, match="without a speculative row"):
                store.commit(session.cache, torch.tensor([1]), torch.tensor([commit_len]))
        store.commit(session.cache, plan.state_slots, torch.tensor([commit_len]))
    session.lengths[2] = len(prompt) + commit_len
    return session


# The Triton commit only exists in REPLAY mode (SNAPSHOT copies a stored state).
@pytest.mark.parametrize("mode,commit_impl", [(CommitMode.REPLAY, "torch"),
                                              (CommitMode.REPLAY, "triton"),
                                              (CommitMode.SNAPSHOT, "torch")])
@pytest.mark.parametrize("prompt_len,commit_len", [(21, 1), (22, 3), (23, 8), (24, 6)])
def test_commit_equals_feeding_the_accepted_tokens(tiny_model, mode, commit_impl, prompt_len,
                                                   commit_len):
    cfg = tiny_model.cfg
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
    window = torch.randint(0, cfg.vocab_size, (8,), generator=g).tolist()
    spec = _run(tiny_model, prompt, window, commit_len, mode, commit_impl)
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
