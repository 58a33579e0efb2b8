"""Parallel samples across a prefill and a decode engine (the engine half of PD ``n > 1``): one
prefill of the prompt, its pages allocated once on each side, the samples forked on decode with
their own state, and the same tokens and logprobs as one mixed engine forking them."""

from __future__ import annotations

import pytest

from glmlab.core import FinishReason, SamplingParams, Status, sample_rid
from glmlab.engine.local_pd import LocalPD

N, PAGE = 4, 16


def _run(engine, rids):
    while engine.has_work:
        engine.step()
    return [engine.request(r) for r in rids]


def _mixed(make_engine, prompt, params):
    engine = make_engine(page_size=PAGE)
    rid = engine.add_request(prompt, params, rid="m")
    outs = {}
    while engine.has_work:
        for o in engine.step():
            outs.setdefault(o.rid, []).extend(o.logprobs or ())
    rids = [sample_rid(rid, i) for i in range(params.n)]
    return [engine.request(r).output_ids for r in rids], [outs[r] for r in rids]


def _prefill(make_engine, prompt, params):
    """(prefill engine, parent rid, {sample rid: its first-token record})"""
    pre = make_engine(page_size=PAGE)
    rid = pre.add_request(prompt, params, rid="p", hold_after_prefill=True)
    firsts = {o.rid: o for o in pre.step()}
    return pre, rid, firsts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_prefill_one_import_n_samples_equal_mixed(make_engine, ids, temperature):
    prompt = ids(37, 3)  # two whole pages and a partial one
    params = SamplingParams(n=N, temperature=temperature, seed=5, max_new_tokens=6,
                            ignore_eos=True, logprobs=3, frequency_penalty=0.3)
    want_ids, want_lps = _mixed(make_engine, prompt, params)

    pre, rp, firsts = _prefill(make_engine, prompt, params)
    assert sorted(firsts) == sorted(sample_rid(rp, i) for i in range(N))
    assert all(o.finish_reason is FinishReason.PREFILLED for o in firsts.values())
    stats = pre.stats()
    assert stats.prefill_compute_tokens == len(prompt)  # one prefill for the n samples
    assert stats.pages_allocated == 3  # the prompt's pages, once
    assert pre.request(rp).status is Status.HELD  # the parent alone holds the cache
    assert all(pre.request(sample_rid(rp, i)).status is Status.FINISHED for i in range(1, N))
    assert stats.state_slots_used == 1

    dec = make_engine(page_size=PAGE, radix="kv_only")
    rd = dec.add_request(prompt, params, rid="d", imported=True)
    dec.step()
    (target,) = dec.import_targets()
    assert target.rid == rd and len(target.sample_slots) == N - 1
    assert dec.stats().state_slots_used == N and dec.stats().pages_allocated == 3
    src = pre.export_target(rp)
    dec.cache.storage.copy_from(pre.cache.storage, list(src.pages), list(target.transfer_pages),
                                src.state_slot, target.state_slot)
    pre.release_held(rp)
    pre.assert_idle()
    first = [firsts[sample_rid(rp, i)] for i in range(N)]
    outs = dec.complete_import(rd, first[0].new_token_ids[0], first[0].logprobs[0],
                               samples=[(o.new_token_ids[0], o.logprobs[0]) for o in first[1:]])
    assert [o.rid for o in outs] == [sample_rid(rd, i) for i in range(N)]
    leases = [dec.request(sample_rid(rd, i)).cache for i in range(N)]
    assert all(lease.pages[:2] == leases[0].pages[:2] for lease in leases)  # shared once
    assert len({lease.slot for lease in leases}) == N  # state: one copy per sample
    assert {lease.slot for lease in leases} == {target.state_slot, *target.sample_slots}
    # every sample's pages beyond the shared two are its own (the partial page copied)
    assert len({p for lease in leases for p in lease.pages[2:]}) == sum(
        len(lease.pages) - 2 for lease in leases)
    lps = {o.rid: list(o.logprobs) for o in outs}
    while dec.has_work:
        for o in dec.step():
            lps[o.rid].extend(o.logprobs)
    got = [dec.request(sample_rid(rd, i)).output_ids for i in range(N)]
    assert got == want_ids
    for mine, theirs in zip((lps[sample_rid(rd, i)] for i in range(N)), want_lps, strict=True):
        assert [t.token_id for t in mine] == [t.token_id for t in theirs]
        assert [[a for a, _ in t.top] for t in mine] == [[a for a, _ in t.top] for t in theirs]
        assert [t.logprob for t in mine] == pytest.approx([t.logprob for t in theirs], abs=1e-5)
    assert dec.stats().prefill_compute_tokens == 0  # decode computed no prompt
    dec.assert_idle()


def test_abort_before_landing_gives_every_sample_slot_back(make_engine, ids):
    dec = make_engine(page_size=PAGE, radix="kv_only")
    params = SamplingParams(n=N, max_new_tokens=4, ignore_eos=True)
    rid = dec.add_request(ids(40, 1), params, imported=True)
    dec.step()
    assert dec.stats().state_slots_used == N
    dec.abort(rid)
    dec.assert_idle()
    with pytest.raises(ValueError, match="waiting for an import"):
        dec.complete_import(rid, 1, samples=[(1, None)] * (N - 1))


def test_wrong_number_of_first_tokens_is_refused_before_anything_changes(make_engine, ids):
    dec = make_engine(page_size=PAGE)
    rid = dec.add_request(ids(20, 1), SamplingParams(n=3, max_new_tokens=4), imported=True)
    dec.step()
    with pytest.raises(ValueError, match="lands 3 samples, given 2"):
        dec.complete_import(rid, 7, samples=[(8, None)])
    assert [t.rid for t in dec.import_targets()] == [rid]
    dec.abort(rid)
    dec.assert_idle()


def test_samples_without_pages_at_landing_recompute_and_match(make_engine, ids):
    """A decode pool too small to fork every sample at landing: the ones left over queue, compute
    prompt + first token themselves, and still produce the mixed engine's tokens."""
    prompt = ids(40, 4)
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=30, ignore_eos=True)
    want, _ = _mixed(make_engine, prompt, params)
    pre, rp, firsts = _prefill(make_engine, prompt, params)
    # 3 pages for the prompt, a fork takes 3 (its 5 at full length but the 2 shared): 8 pages
    # hold the parent and one fork only
    dec = make_engine(page_size=PAGE, max_pages=8, context_len=128)
    rd = dec.add_request(prompt, params, rid="d", imported=True)
    dec.step()
    (target,) = dec.import_targets()
    src = pre.export_target(rp)
    dec.cache.storage.copy_from(pre.cache.storage, list(src.pages), list(target.transfer_pages),
                                src.state_slot, target.state_slot)
    tok = [firsts[sample_rid(rp, i)].new_token_ids[0] for i in range(3)]
    dec.complete_import(rd, tok[0], samples=[(t, None) for t in tok[1:]])
    assert dec.request(sample_rid(rd, 2)).status is Status.WAITING  # no pages: queued
    reqs = _run(dec, [sample_rid(rd, i) for i in range(3)])
    assert [r.output_ids for r in reqs] == want
    assert dec.stats().prefill_compute_tokens > 0  # the queued one computed its prompt
    dec.assert_idle()


def test_local_pd_moves_one_cache_for_n_samples(make_engine, ids):
    prompt = ids(50, 6)
    params = SamplingParams(n=3, temperature=1.0, seed=9, max_new_tokens=5, ignore_eos=True)
    want, _ = _mixed(make_engine, prompt, params)
    pd = LocalPD(make_engine(page_size=PAGE), make_engine(page_size=PAGE, radix="kv_only"))
    (h,) = pd.submit([prompt], params)
    reqs = _run(pd.decode, [sample_rid(h.rid, i) for i in range(3)])
    assert [r.output_ids for r in reqs] == want
    assert pd.prefill.stats().prefill_compute_tokens == len(prompt)
    one = LocalPD(make_engine(page_size=PAGE), make_engine(page_size=PAGE, radix="kv_only"))
    (h1,) = one.submit([prompt], SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert h.bytes_moved == h1.bytes_moved  # one prompt's pages and state, not three
