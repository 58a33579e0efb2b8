"""The batched sampler (glmlab.sampling) against per-request torch references, and the engine's
parallel samples, logprobs and prompt logprobs against the model run directly (Session)."""

from __future__ import annotations

import math

import pytest
import torch

from glmlab.core import InvalidRequest, Req, SamplingParams, sample_rid
from glmlab.model.session import Session
from glmlab.sampling import BatchSampler, filter_probs, sample_seed, seeded_uniform

V = 50


def _req(rid: str, prompt: list[int], out: list[int], **params) -> Req:
    p = SamplingParams(max_new_tokens=64, **params)
    stop = frozenset(p.stop_token_ids)
    return Req(rid, prompt + out, len(prompt), p, len(prompt) + 64, stop, seed=hash(rid) % 997)


def _reference_adjust(req: Req, logits: torch.Tensor) -> torch.Tensor:
    """One request at a time, written from the definitions (HF repetition penalty, OpenAI
    frequency / presence penalties, logit_bias, stop tokens masked before min_new_tokens)."""
    p, x = req.params, logits.clone()
    outputs = req.token_ids[req.num_prompt:]
    for t in set(req.token_ids):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(outputs):
        x[t] -= p.frequency_penalty * outputs.count(t) + p.presence_penalty
    for t, b in p.logit_bias:
        x[t] += b
    if len(outputs) < p.min_new_tokens:
        for t in req.stop_ids:
            x[t] = float("-inf")
    return x


def test_penalties_bias_and_min_tokens_match_a_per_request_reference():
    g = torch.Generator().manual_seed(0)
    reqs = [
        _req("a", [1, 2, 3, 3], [4, 4, 5], repetition_penalty=1.3, frequency_penalty=0.7),
        _req("b", [7, 8], [9], presence_penalty=-0.5, logit_bias=((3, 5.0), (10, -100.0))),
        _req("c", [1], [2, 2, 2], stop_token_ids=(6, 11), min_new_tokens=5,
             repetition_penalty=0.8),
        _req("plain", [5, 6], [7]),
    ]
    logits = torch.randn(len(reqs), V, generator=g) * 3
    sampler = BatchSampler(V, "cpu")
    got = sampler.adjust(reqs, logits)
    for i, r in enumerate(reqs):
        torch.testing.assert_close(got[i], _reference_adjust(r, logits[i]))
    # after a draw the counts follow the new token (greedy: argmax of the adjusted row)
    first = [s.tokens[0] for s in sampler.sample(reqs, logits)]
    assert first == got.argmax(-1).tolist()
    for r, t in zip(reqs, first, strict=True):
        r.token_ids.append(t)
    again = sampler.adjust(reqs, logits)
    for i, r in enumerate(reqs):
        torch.testing.assert_close(again[i], _reference_adjust(r, logits[i]))
    sampler.release("a")
    assert "a" not in sampler.extras.rows


def test_filter_probs_matches_per_row_top_k_top_p_min_p():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, V, generator=g) * 2
    temp = torch.tensor([0.7, 1.0, 1.3, 0.5])
    top_k = torch.tensor([5, -1, 20, -1])
    top_p = torch.tensor([1.0, 0.8, 0.6, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.2])
    got = filter_probs(logits, temp, top_k, top_p, min_p)
    for i in range(4):
        x = logits[i] / temp[i]
        if top_k[i] > 0:
            x = x.masked_fill(x < torch.topk(x, int(top_k[i])).values[-1], float("-inf"))
        p = x.softmax(-1)
        order = p.argsort(descending=True)
        keep, mass = torch.zeros(V, dtype=torch.bool), 0.0
        for t in order.tolist():  # the smallest prefix whose mass reaches top_p
            if mass >= top_p[i]:
                break
            keep[t], mass = True, mass + float(p[t])
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
        p = torch.where(p >= p.max() * min_p[i], p, 0.0)
        torch.testing.assert_close(got[i], p / p.sum())


def test_seeded_draws_follow_the_distribution_and_ignore_the_batch():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    n = 20000
    u = seeded_uniform(torch.full((n,), 123), torch.arange(n), 4)
    draws = (probs / -torch.log(u)).argmax(-1)
    freq = torch.bincount(draws, minlength=4).float() / n
    # 4 standard errors of a binomial proportion: fails on a biased race or a bad hash
    assert torch.all((freq - probs).abs() < 4 * torch.sqrt(probs * (1 - probs) / n)), freq
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    # a row's uniforms depend on (seed, position) only, not on the rows beside it
    alone = seeded_uniform(torch.tensor([7]), torch.tensor([40]), 4)
    batched = seeded_uniform(torch.tensor([1, 7, 9]), torch.tensor([3, 40, 40]), 4)
    assert torch.equal(alone[0], batched[1]) and not torch.equal(batched[1], batched[2])
    assert sample_seed(5, 0) == 5 and len({sample_seed(5, i) for i in range(8)}) == 8


def test_params_are_validated_with_their_field():
    for field, value in (("n", 0), ("min_p", 1.5), ("frequency_penalty", 3.0),
                         ("presence_penalty", -2.5), ("repetition_penalty", 0.0),
                         ("min_new_tokens", 200), ("prompt_logprobs_from", -1)):
        with pytest.raises(InvalidRequest) as e:
            SamplingParams(**{field: value})
        assert e.value.field == field
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(logit_bias=((1, 101.0),))
    assert e.value.field == "logit_bias"


# ----------------------------------------------------------------------------- through the engine
def _session_logits(model, ids: list[int]) -> torch.Tensor:
    return Session(model, 1, max_len=len(ids) + 1, page_size=16).logits({0: ids})[0]


def test_parallel_samples_share_one_prefill_and_match_single_requests(make_engine, tiny_model,
                                                                      ids):
    prompt = ids(37, 1)  # 2 whole pages of 16 + a partial one the samples copy
    engine = make_engine(page_size=16)
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_new_tokens=10, ignore_eos=True)
    rid = engine.add_request(prompt, params, rid="p")
    engine.step()  # the prompt's one prefill; the samples fork from it
    assert engine.stats().prompt_tokens == len(prompt)
    leases = [engine.request(sample_rid(rid, i)).cache for i in range(3)]
    shared = leases[0].pages[:2]
    assert all(lease.pages[:2] == shared for lease in leases)
    assert all(engine.cache.pages.refcount(p) == 3 for p in shared)
    assert len({lease.pages[2] for lease in leases}) == 3  # the partial page: one copy each
    assert len({lease.slot for lease in leases}) == 3  # state: request-local
    while engine.has_work:
        engine.step()
    outs = [engine.request(sample_rid(rid, i)).output_ids for i in range(3)]
    assert len({tuple(o) for o in outs}) > 1  # different seeds, different samples
    # each sample equals one request with that sample's seed, computed from scratch
    for i, out in enumerate(outs):
        one = make_engine(page_size=16)
        r = one.add_request(prompt, SamplingParams(temperature=1.0, seed=sample_seed(11, i),
                                                   max_new_tokens=10, ignore_eos=True))
        while one.has_work:
            one.step()
        assert one.request(r).output_ids == out
    engine.assert_idle()


def test_logprobs_top_k_and_prompt_logprobs_are_log_softmax_of_the_model(make_engine,
                                                                         tiny_model, ids):
    prompt = ids(21, 2)
    engine = make_engine(page_size=16, chunk_size=16)  # the prompt spans two chunks
    params = SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=3,
                            prompt_logprobs_from=0)
    rid = engine.add_request(prompt, params)
    records = []
    while engine.has_work:
        records += [o for o in engine.step() if o.rid == rid]
    out = engine.request(rid).output_ids
    ref = torch.log_softmax(_session_logits(tiny_model, prompt + out), -1)
    first = next(o for o in records if o.new_token_ids)
    assert first.prompt_logprobs[0] is None and len(first.prompt_logprobs) == len(prompt)
    for pos, lp in enumerate(first.prompt_logprobs[1:], start=1):
        assert lp.token_id == prompt[pos]
        assert math.isclose(lp.logprob, float(ref[pos - 1, prompt[pos]]), abs_tol=1e-4)
        assert [t for t, _ in lp.top] == ref[pos - 1].topk(3).indices.tolist()
    lps = [lp for o in records for lp in (o.logprobs or ())]
    assert [lp.token_id for lp in lps] == out
    for k, lp in enumerate(lps):
        row = ref[len(prompt) - 1 + k]
        assert math.isclose(lp.logprob, float(row[out[k]]), abs_tol=1e-4)
        assert [t for t, _ in lp.top] == row.topk(3).indices.tolist()
        assert all(math.isclose(v, float(row[t]), abs_tol=1e-4) for t, v in lp.top)
    engine.assert_idle()


def test_logit_bias_min_tokens_and_stop_ids_in_the_engine(make_engine, ids):
    prompt = ids(9, 3)
    engine = make_engine()
    forced = engine.add_request(prompt, SamplingParams(max_new_tokens=3,
                                                       logit_bias=((42, 100.0),)))
    plain = engine.add_request(prompt, SamplingParams(max_new_tokens=3))
    while engine.has_work:
        engine.step()
    assert engine.request(forced).output_ids == [42, 42, 42]
    greedy = engine.request(plain).output_ids
    # the greedy first token as a stop id ends at once, unless min_new_tokens holds it off
    stop = engine.add_request(prompt, SamplingParams(max_new_tokens=5,
                                                     stop_token_ids=(greedy[0],)))
    held = engine.add_request(prompt, SamplingParams(max_new_tokens=5, min_new_tokens=2,
                                                     stop_token_ids=(greedy[0],)))
    while engine.has_work:
        engine.step()
    assert engine.request(stop).output_ids == [greedy[0]]
    got = engine.request(held).output_ids
    assert greedy[0] not in got[:2] and len(got) >= 3
    with pytest.raises(InvalidRequest) as e:
        engine.add_request(prompt, SamplingParams(logit_bias=((10_000, 1.0),)))
    assert e.value.field == "logit_bias"
    engine.assert_idle()


@pytest.mark.parametrize("v, k", [(40_000, 20), (32_768, 1), (65_537, 5), (154_880, 20)])
def test_two_stage_top_k_equals_torchs(v, k):
    from glmlab.sampling import TOP_K_SPLIT_MIN, top_k

    assert v >= TOP_K_SPLIT_MIN  # the split path, not torch's own
    x = torch.randn(3, v, generator=torch.Generator().manual_seed(v))
    x[1, -1] = 50.0  # a winner in the last block (padded unless a block count divides v)
    values, ids = top_k(x, k)
    want = x.topk(k, dim=-1)
    assert torch.equal(values, want.values) and torch.equal(ids, want.indices)


def test_triton_logprobs_give_the_same_sampled_records():
    """The sampler with the one-pass logprobs kernel (glmlab.kernels.sampling.logprobs_triton,
    interpreted on CPU) against its torch table: the same tokens, token ids and top ids, and
    logprobs within 1e-5; rows that ask for none, 0, 1 or 3 alternatives in one batch."""
    kernel = pytest.importorskip("glmlab.kernels.sampling.logprobs_triton")
    v = 300
    asks = [3, None, 0, 1, 3]
    reqs = [_req(f"r{i}", [1, 2, i], [], logprobs=k, temperature=0.0 if i % 2 else 1.0, seed=i)
            for i, k in enumerate(asks)]
    logits = torch.randn(len(reqs), v, generator=torch.Generator().manual_seed(5)) * 3
    a = BatchSampler(v, "cpu").sample(reqs, logits)
    b = BatchSampler(v, "cpu", logprobs=kernel.logprob_table_triton).sample(reqs, logits)
    assert [s.tokens for s in a] == [s.tokens for s in b]
    for want, got, k in zip(a, b, asks, strict=True):
        if k is None:
            assert want.logprobs is None and got.logprobs is None
            continue
        (w,), (g,) = want.logprobs, got.logprobs
        assert g.token_id == w.token_id and math.isclose(g.logprob, w.logprob, abs_tol=1e-5)
        assert len(g.top) == len(w.top) == k
        assert [t for t, _ in g.top] == [t for t, _ in w.top]
        assert all(math.isclose(x, y, abs_tol=1e-5)
                   for (_, x), (_, y) in zip(g.top, w.top, strict=True))
