"""Engine greedy output == the model's own greedy loop (Session) == transformers, token for token,
for a batch of mixed lengths under every scheduling shape: whole prompts, chunked prefill with
small budgets (mixed prefill/decode steps), chunking off, and both radix modes."""

from __future__ import annotations

import pytest

from glmlab.core import SamplingParams
from glmlab.model.session import Session
from glmlab.testing.oracle import load_hf_model
from glmlab.testing.parity import hf_greedy, prompt_ids

NEW = 12
LENGTHS = (3, 17, 40, 64, 90, 131)  # below and above the tiny top-k (16), on and off pages
PARAMS = SamplingParams(max_new_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    return [prompt_ids(n, 7 * n) for n in LENGTHS]


@pytest.fixture(scope="module")
def session_greedy(tiny_model, prompts):
    return [Session(tiny_model, max_len=len(p) + NEW).generate(0, p, PARAMS) for p in prompts]


def test_session_greedy_matches_transformers(tiny_path, prompts, session_greedy):
    hf = load_hf_model(tiny_path)
    assert [hf_greedy(hf, p, NEW) for p in prompts] == session_greedy


@pytest.mark.parametrize("options", [
    pytest.param({}, id="whole-prompts"),
    pytest.param({"chunk_size": 64, "max_prefill_tokens": 64, "max_num_batched_tokens": 72},
                 id="chunked-64-mixed"),
    pytest.param({"chunked_prefill": False, "max_prefill_tokens": 64}, id="unchunked"),
    pytest.param({"radix": "kv_and_state", "chunk_size": 64}, id="radix-kv-and-state"),
    pytest.param({"radix": "kv_only", "max_running_requests": 2}, id="radix-kv-only"),
])
def test_engine_greedy_matches_session(options, prompts, session_greedy, make_engine, run):
    engine = make_engine(**options)
    assert run(engine, [(p, PARAMS) for p in prompts]) == session_greedy
    engine.cache.check_idle()


def test_mixed_steps_happen_with_small_budgets(prompts, make_engine):
    from glmlab.trace.tracer import RecordingTracer

    tracer = RecordingTracer()
    engine = make_engine(chunk_size=64, max_prefill_tokens=64, max_num_batched_tokens=72,
                         tracer=tracer)
    for p in prompts:
        engine.add_request(p, PARAMS)
    while engine.has_work:
        engine.step()
    steps = tracer.steps
    assert any(s.prefill_tokens and s.decode_tokens for s in steps), "no mixed step"
    assert all(s.prefill_tokens <= 64 and s.prefill_tokens + s.decode_tokens <= 72 for s in steps)
    assert max(n for s in steps for _, ph, _, n in s.entries if ph == "prefill") <= 64
