"""Prefix sharing: kv_and_state reuses KV + a state checkpoint for requests computed here; kv_only
shares KV among requests that bring their own end-of-prompt state (a PD decode instance), which
turns N x (Lp + Ls) token slots into Lp + N x Ls. The state comes from a reference computation:
a prefill engine holding its requests after the first token, as a PD prefill instance does."""

from __future__ import annotations

import pytest

from glmlab.core import FinishReason, SamplingParams
from glmlab.engine.local_pd import LocalPD, slot_accounting
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids

PARAMS = SamplingParams(max_new_tokens=8, ignore_eos=True)
PREFIX = prompt_ids(192, 1)  # three whole pages
SUFFIX_LENS = (5, 23, 40, 61)


def _session(model, p):
    return Session(model, max_len=len(p) + PARAMS.max_new_tokens).generate(0, p, PARAMS)


def test_kv_and_state_reuses_checkpoints_and_stays_exact(tiny_model, make_engine, run):
    prompts = [PREFIX + prompt_ids(n, 50 + n) for n in SUFFIX_LENS]
    ref = [_session(tiny_model, p) for p in prompts]
    engine = make_engine(radix="kv_and_state", chunk_size=64)
    # wave 1: one request computes the prefix and leaves KV + checkpoints in the tree;
    # wave 2: the next one branches off at the prefix (no checkpoint there yet: it makes one);
    # wave 3: the rest reuse the branch checkpoint
    outs = run(engine, [(prompts[0], PARAMS)]) + run(engine, [(prompts[1], PARAMS)])
    outs += run(engine, [(p, PARAMS) for p in prompts[2:]])
    assert outs == ref
    cached = [engine.request(f"r{i}").cached_tokens for i in range(len(prompts))]
    assert cached[0] == 0 and all(c == len(PREFIX) for c in cached[2:]), cached
    assert engine.cache.stats.hit_rate > 0.4
    engine.cache.check_idle()
    assert engine.cache.usage().checkpoints > 0


def test_kv_and_state_multi_turn_reuses_the_last_page_boundary(tiny_model, make_engine, run):
    engine = make_engine(radix="kv_and_state")
    first = prompt_ids(150, 3)
    (out,) = run(engine, [(first, PARAMS)])
    follow = first + out + prompt_ids(20, 4)
    assert run(engine, [(follow, PARAMS)]) == [_session(tiny_model, follow)]
    assert engine.request("r1").cached_tokens == 128  # the checkpoint at 150 // 64 * 64


@pytest.mark.parametrize("radix", ["kv_only", "off"])
def test_decode_instance_token_slots(radix, tiny_model, make_engine):
    """N requests sharing Lp tokens, each with its own Ls: Lp + N x Ls token slots with the
    kv_only cache, N x (Lp + Ls) without (page-rounded), and the same tokens either way."""
    lp, ls, new, n = 192, 40, 8, 4
    params = SamplingParams(max_new_tokens=new, ignore_eos=True)
    prompts = [PREFIX + prompt_ids(ls, 90 + i) for i in range(n)]
    pd = LocalPD(make_engine(), make_engine(radix=radix, max_running_requests=n))
    pre, dec = pd.prefill, pd.decode
    handoffs = [h for p in prompts for h in pd.submit([p], params)]  # one after another
    rids, moved = [h.rid for h in handoffs], [h.bytes_moved for h in handoffs]
    # all four run now (the earlier ones decoded a token at each later admission, staying inside
    # their last page: lp + ls + n < 256)
    used = dec.cache.usage().token_slots_used
    per_request = -(-(lp + ls + n) // 64) * 64
    if radix == "kv_only":
        own = per_request - lp
        assert used == lp + n * own  # Lp + N x Ls, page-rounded
        assert moved[1:] == [moved[1]] * (n - 1) and moved[1] < moved[0]  # only the suffix moves
        assert dec.cache.stats.cached_tokens == (n - 1) * lp
    else:
        assert used == n * per_request  # N x (Lp + Ls)
    while dec.has_work:
        dec.step()
    outs = [dec.request(r).output_ids for r in rids]
    assert outs == [_session(tiny_model, p)[:new] for p in prompts]
    dec.cache.check_idle()
    pre.cache.check_idle()


def test_slot_accounting_lp_plus_n_ls(tiny_model):
    """Eight requests, a 200-token shared prefix, 60 tokens each of their own (page-rounded)."""
    acct = slot_accounting(tiny_model, prompt_ids(200, 1), [prompt_ids(60, 10 + i)
                                                            for i in range(8)], context_len=512)
    assert acct.token_slots_shared == acct.expected_shared == 192 + 8 * 128
    assert acct.token_slots_unshared == acct.expected_unshared == 8 * 320
    assert acct.bytes_moved_shared < 0.6 * acct.bytes_moved_unshared  # 19 of 40 pages move
    assert acct.hit_rate == pytest.approx(7 * 192 / (8 * 260))


def test_prefill_role_holds_then_releases(make_engine):
    pre = make_engine()
    rid = pre.add_request(prompt_ids(70, 9), PARAMS, hold_after_prefill=True)
    outs = pre.step()
    assert outs[0].finished and outs[0].finish_reason is FinishReason.PREFILLED
    target = pre.export_target(rid)
    assert target.prompt_len == 70 and len(target.pages) == 2 and target.prefix_len == 0
    assert pre.cache.usage().pages_free == pre.cache.pages.capacity - 2  # held, not freed
    pre.release_held(rid)
    pre.cache.check_idle()
    with pytest.raises(ValueError, match="not held"):
        pre.export_target(rid)


def test_abort_while_awaiting_import_frees_everything(make_engine):
    dec = make_engine(radix="kv_only")
    rid = dec.add_request(prompt_ids(100, 2), PARAMS, imported=True)
    dec.step()
    assert [t.rid for t in dec.import_targets()] == [rid]
    dec.abort(rid)
    assert dec.import_targets() == []
    dec.cache.check_idle()
    with pytest.raises(ValueError, match="waiting for an import"):
        dec.complete_import(rid, 1)
