"""Speculative decoding as the engine's VERIFY phase: lossless against plain engine decoding,
batched with mixed accept lengths, budgeted, and leak-free through finishes, aborts and
preemption."""

from __future__ import annotations

import json

import pytest

from glmlab.core import Phase, SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.dflash_io import write_random_draft
from glmlab.speculative.oracle import OracleDrafter
from glmlab.testing.parity import prompt_ids

PROMPTS = [prompt_ids(n, 11 * n) for n in (5, 23, 41)]  # below / above the tiny top-k (16)
PARAMS = SamplingParams(max_new_tokens=14, ignore_eos=True)
MTP718 = SpecConfig(algorithm="mtp", num_steps=7)


def _engine(model, spec=None, **options) -> Engine:
    options = {"context_len": 256, "max_pages": 64, "print_budget": False, **options}
    return Engine(model, EngineConfig(speculative=spec, **options))


def _run(engine, prompts=PROMPTS, params=PARAMS, until=None):
    rids = [engine.add_request(p, params) for p in prompts]
    while engine.has_work:
        engine.step()
        if until is not None and until(engine, rids):
            break
    return rids, [engine.request(r).output_ids for r in rids]


def _assert_idle(engine):
    engine.cache.check_idle()
    held = engine.spec.held(engine.scheduler.running)
    assert held == {"rows": 0, "slots": 0, "learned": 0}, held
    assert len(engine.spec.free_rows) == engine.budget.inputs.spec_slots
    drafter = engine.spec.decoder.drafter
    assert not getattr(drafter, "_hidden", {}), "drafter state leaked"


@pytest.fixture(scope="module")
def plain(tiny_model):
    return _run(_engine(tiny_model))[1]


def test_mtp718_in_the_engine_is_lossless(tiny_model, plain):
    engine = _engine(tiny_model, MTP718)
    assert engine.budget.spec_bytes > 0 and engine.budget.inputs.spec_slots >= 2
    rids, outs = _run(engine)
    assert outs == plain
    s = engine.spec.summary()
    assert s["cycles"] > 0 and s["mean_batch"] > 1 and not s["simulated"]
    _assert_idle(engine)


def test_dflash2_fp8_draft_kv_in_the_engine(tiny_model, plain, tmp_path):
    draft = write_random_draft(tiny_model.cfg, tmp_path / "draft", block_size=8)
    spec = SpecConfig(algorithm="dflash2", block_size=8, draft_path=str(draft),
                      draft_kv_dtype="fp8", commit="snapshot")
    engine = _engine(tiny_model, spec)
    assert engine.budget.draft_kv_bytes > 0
    assert _run(engine)[1] == plain
    _assert_idle(engine)


def _oracle(engine, reference, wrong):
    """Replace the drafter by one proposing each request's reference continuation."""
    def ref_of(slot):
        req = next(r for r in engine.scheduler.running if r.cache.slot == slot)
        return reference[int(req.rid[1:])]

    wrong_at = lambda slot, pos: pos in wrong.get(  # noqa: E731
        int(next(r for r in engine.scheduler.running if r.cache.slot == slot).rid[1:]), ())
    engine.spec.decoder.drafter = OracleDrafter(engine.spec.width, ref_of,
                                                engine.model.cfg.vocab_size, wrong=wrong_at)


def test_mixed_accept_lengths_in_one_batch(tiny_model, plain):
    reference = [p + o for p, o in zip(PROMPTS, plain, strict=True)]
    wrong = {1: {26, 30}, 2: {45}}  # request 0 is always right: full windows
    engine = _engine(tiny_model, MTP718)
    _oracle(engine, reference, wrong)
    assert _run(engine)[1] == plain
    lens = [s.commit_lens for s in engine.spec.stats]
    assert any(len(set(c)) > 1 for c in lens if len(c) > 1), lens  # different in one cycle
    assert 8 in {c for cyc in lens for c in cyc}
    _assert_idle(engine)


def test_finish_mid_window_and_abort_mid_cycle_leak_nothing(tiny_model, plain):
    reference = [p + o for p, o in zip(PROMPTS, plain, strict=True)]
    engine = _engine(tiny_model, MTP718)
    _oracle(engine, reference, {})
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)  # 1 + 8 + (1 of the next 8)
    first_cycle = lambda e, rids: bool(e.spec.stats)  # noqa: E731
    rids, _ = _run(engine, params=params, until=first_cycle)
    assert engine.spec.held(engine.scheduler.running)["rows"] == 3  # all mid-speculation
    engine.abort(rids[1])
    while engine.has_work:
        engine.step()
    assert engine.request(rids[1]).finish_reason.value == "abort"
    for i in (0, 2):
        assert engine.request(rids[i]).output_ids == plain[i][:10]
    _assert_idle(engine)


def test_preemption_under_speculation(tiny_model):
    """Requests outgrow the pages: preempted speculating requests recompute and stay lossless."""
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompts = [prompt_ids(40 + 3 * i, 50 + i) for i in range(6)]
    want = _run(_engine(tiny_model, max_pages=64), prompts, params)[1]
    engine = _engine(tiny_model, MTP718, max_pages=8, max_running_requests=6)
    rids, outs = _run(engine, prompts, params)
    assert sum(engine.request(r).num_preemptions for r in rids) > 0
    assert outs == want
    _assert_idle(engine)


def test_verify_entries_are_scheduled_with_their_window(tiny_model):
    engine = _engine(tiny_model, MTP718)
    engine.add_request(PROMPTS[1], PARAMS)
    engine.step()  # prefill: the drafter learns the prompt
    batch = engine.scheduler.schedule()
    (entry,) = batch.entries
    assert entry.phase is Phase.VERIFY and entry.num_tokens == 8 and batch.phase is Phase.VERIFY
    req = entry.req
    assert len(req.cache.pages) * engine.cache.page_size >= req.computed_len + 8


def test_generate_cli_speculative(capsys, tmp_path):
    from glmlab.cli import main

    base = ["generate", "--model", "tiny", "--prompt-ids", ",".join(map(str, PROMPTS[1])),
            "--max-new-tokens", "10", "--ignore-eos", "--json", "--context-len", "128"]
    runs = {}
    for name, extra in {"plain": [], "mtp": ["--speculative", "mtp"],
                        "sim": ["--speculative", "mtp", "--speculative-num-steps", "5",
                                "--speculative-simulate-accept-len", "5.5"]}.items():
        assert main(base + extra) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["mtp"]["output_ids"] == runs["plain"]["output_ids"]
    assert "speculative" not in runs["plain"] and not runs["mtp"]["speculative"]["simulated"]
    sim = runs["sim"]["speculative"]
    assert sim["simulated"] and sim["accept_len"] > 4  # simulated commits, labelled as such


def test_sampled_requests_speculate_with_their_own_generators(tiny_model, tmp_path):
    """Seeded sampling through both drafters: proposal distributions reach the verifier, and a
    seeded request draws the same tokens on a rerun."""
    draft = write_random_draft(tiny_model.cfg, tmp_path / "draft", block_size=6)
    for spec in (MTP718, SpecConfig(algorithm="dflash2", block_size=6, draft_path=str(draft))):
        params = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=20, seed=3,
                                ignore_eos=True)
        runs = [_run(_engine(tiny_model, spec), PROMPTS[:2], params)[1] for _ in range(2)]
        assert runs[0] == runs[1]
        assert all(len(o) == 12 and all(0 <= t < tiny_model.cfg.vocab_size for t in o)
                   for o in runs[0])


def test_speculative_logprobs_equal_plain_decoding(tiny_model, plain):
    """Emitted tokens' logprobs come from the verify logits: the same numbers plain decoding
    reports (up to the window's reassociated sums), for windows accepted in part or whole."""
    params = SamplingParams(max_new_tokens=14, ignore_eos=True, logprobs=2)
    reference = [p + o for p, o in zip(PROMPTS, plain, strict=True)]
    records = {}
    for name, spec in (("plain", None), ("mtp", MTP718)):
        engine = _engine(tiny_model, spec)
        if spec is not None:
            _oracle(engine, reference, {1: {26, 30}})
        rids = [engine.add_request(p, params) for p in PROMPTS]
        outs = []
        while engine.has_work:
            outs += engine.step()
        records[name] = [[lp for o in outs if o.rid == r for lp in o.logprobs] for r in rids]
    assert any(len(o.new_token_ids) > 1 for o in outs)  # windows emitted several tokens
    for a, b, want in zip(records["plain"], records["mtp"], plain, strict=True):
        assert [x.token_id for x in a] == [x.token_id for x in b] == want
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a, b, strict=True)) < 1e-4
        assert [[t for t, _ in x.top] for x in a] == [[t for t, _ in y.top] for y in b]
