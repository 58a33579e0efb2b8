"""Request handling: validation errors, stop conditions, seeded sampling, aborts, preemption."""

from __future__ import annotations

import pytest

from glmlab.core import FinishReason, InvalidRequest, SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids
from glmlab.tokenizer import Tokenizer

GREEDY = SamplingParams(max_new_tokens=10, ignore_eos=True)


@pytest.mark.parametrize("prompt,params,match", [
    ([], GREEDY, "empty"),
    (list(range(300)) * 2, GREEDY, "context holds 512"),
    ([1, 2, 999], GREEDY, r"token ids must be in \[0, 320\)"),
    ([1, 2, 3], SamplingParams(stop=("x",)), "need a tokenizer"),
], ids=["empty", "too-long", "out-of-vocab", "stop-string-without-tokenizer"])
def test_bad_requests_fail_clearly(make_engine, prompt, params, match):
    engine = make_engine()
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, params)
    assert not engine.has_work


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"seed": -2}, "seed"), ({"stop": ("",)}, "stop"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_invalid_sampling_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"chunk_size": 100}, "multiple of page_size"), ({"mem_fraction": 1.5}, "mem_fraction"),
    ({"kv_dtype": "int4"}, "choose one of auto, bf16, fp8"), ({"radix": "yes"}, "radix"),
    ({"max_pages": 0}, "max_pages"), ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
])
def test_invalid_engine_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_duplicate_ids_and_requests_larger_than_the_pool(make_engine):
    with pytest.raises(ValueError, match="no request fits"):
        make_engine(max_pages=4)  # not one 512-token request
    engine = make_engine(max_pages=4, max_running_requests=2)  # overcommitted on purpose
    engine.add_request([1, 2, 3], GREEDY, rid="a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1, 2, 3], GREEDY, rid="a")
    with pytest.raises(ValueError, match="more KV pages than the pool holds"):
        engine.add_request(list(range(300)), SamplingParams(max_new_tokens=100))


def test_stop_tokens_eos_and_lengths(make_engine, run, tiny_model):
    p = prompt_ids(20, 1)
    ref = Session(tiny_model, max_len=64).generate(0, p, GREEDY)
    stop_at = ref[3]
    engine = make_engine()
    outs = run(engine, [(p, SamplingParams(max_new_tokens=10, stop_token_ids=(stop_at,))),
                        (p, GREEDY), (prompt_ids(505, 2), SamplingParams(max_new_tokens=7))])
    assert outs[0] == ref[: ref.index(stop_at) + 1]
    assert engine.request("r0").finish_reason is FinishReason.STOP
    assert engine.request("r0").matched_stop == stop_at
    assert outs[1] == ref and engine.request("r1").finish_reason is FinishReason.LENGTH
    assert len(outs[2]) == 7  # exactly fills the context
    with pytest.raises(InvalidRequest, match="exceeds the context length") as bad:
        engine.add_request(prompt_ids(505, 2), GREEDY)  # rejected, not clamped
    assert bad.value.field == "max_new_tokens"
    eos_engine = Engine(tiny_model, EngineConfig(context_len=512, print_budget=False),
                        eos_token_ids=(stop_at,))  # as if the checkpoint's EOS were this token
    rid = eos_engine.add_request(p, SamplingParams(max_new_tokens=10))
    while eos_engine.has_work:
        eos_engine.step()
    assert eos_engine.request(rid).finish_reason is FinishReason.STOP


def test_stop_strings_end_the_request_and_are_cut_from_text(make_engine, tiny_path, tiny_model):
    tok = Tokenizer.from_dir(tiny_path)
    p = tok.encode("The quick brown fox")
    ref = Session(tiny_model, max_len=64).generate(0, p, SamplingParams(max_new_tokens=16,
                                                                        ignore_eos=True))
    text = tok.decode(ref)
    stop = next(text[i:i + 2] for i in range(3, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    engine = make_engine(tokenizer=tok)
    rid = engine.add_request(p, SamplingParams(max_new_tokens=16, ignore_eos=True, stop=(stop,)))
    while engine.has_work:
        engine.step()
    req = engine.request(rid)
    assert req.finish_reason is FinishReason.STOP and req.matched_stop == stop
    assert stop in tok.decode(req.output_ids) and stop not in tok.decode(req.output_ids[:-1])


def test_seeded_sampling_is_independent_of_the_batch(make_engine, run, tiny_model):
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=12, seed=7,
                            ignore_eos=True)
    p = prompt_ids(30, 3)
    alone = run(make_engine(), [(p, params)])[0]
    crowd = run(make_engine(), [(prompt_ids(n, n), params) for n in (5, 50)] + [(p, params)])[2]
    ref = Session(tiny_model, max_len=64).generate(0, p, params)
    assert alone == crowd == ref
    unseeded = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True)
    a, b = (run(make_engine(seed=s), [(p, unseeded)])[0] for s in (1, 2))
    assert a != b and a == run(make_engine(seed=1), [(p, unseeded)])[0]


def test_aborts_in_queue_prefill_and_decode_free_everything(make_engine):
    engine = make_engine(chunk_size=64, max_prefill_tokens=64, max_running_requests=2)
    r = [engine.add_request(prompt_ids(n, n), GREEDY) for n in (200, 30, 40)]
    engine.step()  # r0 prefills its first chunk, r1 queued behind the prefill budget
    assert engine.request(r[0]).computed_len == 64
    out = engine.abort(r[0])
    assert out.finished and out.finish_reason is FinishReason.ABORT
    engine.abort(r[2])  # still waiting
    for _ in range(3):
        engine.step()
    assert engine.request(r[1]).output_ids  # decoding now
    engine.abort(r[1])
    assert engine.abort("nope") is None and not engine.has_work
    engine.cache.check_idle()


def test_preemption_recomputes_and_keeps_results(make_engine, run, tiny_model):
    """12 requests that outgrow 12 pages: the newest are preempted and recomputed later."""
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [prompt_ids(50 + 3 * i, 100 + i) for i in range(12)]
    engine = make_engine(max_pages=14, max_running_requests=12)
    assert engine.budget.overcommitted
    outs = run(engine, [(p, params) for p in prompts])
    assert sum(engine.request(f"r{i}").num_preemptions for i in range(12)) > 0
    for p, o in zip(prompts, outs, strict=True):
        assert o == Session(tiny_model, max_len=128).generate(0, p, params)
    engine.cache.check_idle()
