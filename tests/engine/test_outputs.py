"""The engine's one record per request and step: token ids, text deltas, logprobs (against the
model's own logits through ``Session``), validation errors naming their field, and the
inspection calls a server uses (stats, flush_cache, leaks)."""

from __future__ import annotations

import pytest
import torch

from glmlab.core import FinishReason, InvalidRequest, SamplingParams
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids
from glmlab.tokenizer import Tokenizer


def _drain(engine):
    outs = []
    while engine.has_work:
        outs += engine.step()
    return outs


def test_logprobs_are_the_models_log_softmax(make_engine, tiny_model):
    prompts = [prompt_ids(30, 1), prompt_ids(75, 2)]
    engine = make_engine()
    greedy = SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=3)
    rids = [engine.add_request(p, greedy) for p in prompts]
    plain = engine.add_request(prompt_ids(10, 3), SamplingParams(max_new_tokens=3))
    outs = _drain(engine)
    assert all(o.logprobs is None for o in outs if o.rid == plain)
    for rid, p in zip(rids, prompts, strict=True):
        mine = [o for o in outs if o.rid == rid]
        tokens = [t for o in mine for t in o.new_token_ids]
        lps = [lp for o in mine for lp in o.logprobs]
        assert [lp.token_id for lp in lps] == tokens and all(len(lp.top) == 3 for lp in lps)
        ref = torch.log_softmax(Session(tiny_model, max_len=96).logits({0: p + tokens})[0], -1)
        ref = ref[len(p) - 1:-1]  # the rows each output token was sampled from
        got = torch.tensor([lp.logprob for lp in lps])
        torch.testing.assert_close(got, ref.gather(-1, torch.tensor(tokens)[:, None])[:, 0],
                                   atol=1e-4, rtol=0)
        top = ref.topk(3, dim=-1)
        assert [[t for t, _ in lp.top] for lp in lps] == top.indices.tolist()
        assert tokens == top.indices[:, 0].tolist()  # greedy: the sampled token is the top one


def test_text_deltas_add_up_to_the_decoded_output(make_engine, tiny_path):
    tok = Tokenizer.from_dir(tiny_path)
    engine = make_engine(tokenizer=tok)
    rid = engine.add_request(tok.encode("Hello"), SamplingParams(max_new_tokens=24,
                                                                 ignore_eos=True))
    outs = [o for o in _drain(engine) if o.rid == rid]
    assert "".join(o.text_delta for o in outs) == tok.decode(engine.request(rid).output_ids)
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].completion_tokens == 24
    assert outs[-1].prompt_tokens == len(tok.encode("Hello"))


@pytest.mark.parametrize("prompt,params,field", [
    ([], SamplingParams(), "prompt"),
    ([1, 2, 999], SamplingParams(), "prompt"),
    ([1.5, 2], SamplingParams(), "prompt"),
    (prompt_ids(600, 0), SamplingParams(), "prompt"),
    (prompt_ids(500, 0), SamplingParams(max_new_tokens=13), "max_new_tokens"),
    ([1, 2], SamplingParams(stop=("x",)), "stop"),
    ([1, 2], {"temperature": 1.0}, "params"),
], ids=["empty", "vocab", "not-int", "prompt-too-long", "over-context", "stop", "params-type"])
def test_invalid_requests_name_their_field(make_engine, prompt, params, field):
    engine = make_engine()
    with pytest.raises(InvalidRequest) as bad:
        engine.add_request(prompt, params)
    assert bad.value.field == field and not engine.has_work


def test_sampling_params_errors_name_their_field():
    with pytest.raises(InvalidRequest) as bad:
        SamplingParams(logprobs=21)
    assert bad.value.field == "logprobs"


def test_stats_flush_and_leaks(make_engine):
    engine = make_engine(radix="kv_and_state")
    engine.add_request(prompt_ids(150, 5), SamplingParams(max_new_tokens=40, ignore_eos=True))
    engine.step()
    s = engine.stats()
    assert (s.running, s.waiting) == (1, 0) and s.pages_used >= 3 and s.state_slots_used >= 1
    assert not engine.flush_cache()  # refused while a request runs
    assert engine.leaks()[0].startswith("not idle")
    _drain(engine)
    s = engine.stats()
    assert engine.is_idle and engine.leaks() == [] and s.pages_tree > 0 and s.prompt_tokens == 150
    assert engine.flush_cache()
    s = engine.stats()
    assert s.pages_used == 0 and s.pages_tree == 0 and s.state_slots_used == 0
    engine.assert_idle()


def test_a_held_first_token_is_held_whatever_it_is(make_engine):
    """Prefill role: even a request that its first token would end (max_new_tokens=1) parks."""
    engine = make_engine()
    rid = engine.add_request(prompt_ids(70, 9), SamplingParams(max_new_tokens=1),
                             hold_after_prefill=True)
    (out,) = engine.step()
    assert out.finish_reason is FinishReason.PREFILLED and len(out.new_token_ids) == 1
    assert engine.export_target(rid).prompt_len == 70
    engine.release_held(rid)
    engine.assert_idle()
