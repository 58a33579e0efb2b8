"""Speculative greedy decoding emits exactly the plain greedy tokens, whatever the drafter proposes,
and leaves the cache as plain decoding does."""

from __future__ import annotations

import pytest
import torch

from glmlab.core import SamplingParams
from glmlab.model.session import Session
from glmlab.speculative.check import lossless_check
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.cycle import SpecDecoder
from glmlab.speculative.dflash import DFlashDrafter
from glmlab.speculative.dflash_io import load_draft, write_random_draft
from glmlab.speculative.draft_kv import DraftKVLayout, DraftKVStore
from glmlab.speculative.layout import SessionLayout
from glmlab.speculative.mtp import MTPDrafter
from glmlab.speculative.oracle import OracleDrafter
from glmlab.speculative.types import SpecRequest
from glmlab.testing.compare import assert_close
from glmlab.testing.parity import prompt_ids

# Prompts longer than the tiny index_topk (16 tokens) so the indexer's pools and tails matter.
PROMPTS = {0: list(range(40, 66)), 1: list(range(100, 119)), 2: [5, 6, 7, 8, 9, 10, 11, 12, 13]}
PARAMS = SamplingParams(max_new_tokens=18, ignore_eos=True)
MAX_LEN = 64


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Plain greedy outputs, and the session that produced them."""
    session = Session(tiny_model, len(PROMPTS), MAX_LEN)
    return {r: session.generate(r, p, PARAMS) for r, p in PROMPTS.items()}, session


@pytest.fixture(scope="module")
def draft_dir(tiny_model, tmp_path_factory):
    return write_random_draft(tiny_model.cfg, tmp_path_factory.mktemp("draft"), block_size=6)


def _spec(model, make_drafter, mode="replay"):
    session = Session(model, len(PROMPTS), MAX_LEN)
    layout = SessionLayout(session)
    dec = SpecDecoder(model, layout, make_drafter(layout, session), mode)
    return dec, dec.generate(PROMPTS, PARAMS), session


def test_mtp718_is_lossless(tiny_model, reference):
    ref, plain = reference
    dec, out, session = _spec(tiny_model, lambda lay, s: MTPDrafter(tiny_model, lay, 7))
    assert out == ref
    # Same committed length as plain decoding (prompt + outputs - 1): same carried state.
    for layer in tiny_model.cfg.kda_layers:
        assert_close("state", plain.cache.recurrent[layer], session.cache.recurrent[layer],
                     "fp32_chunk")


@pytest.mark.parametrize("kv_dtype,mode", [("bf16", "snapshot"), ("fp8", "replay")])
def test_dflash2_is_lossless(tiny_model, reference, draft_dir, kv_dtype, mode):
    draft = load_draft(draft_dir, tiny_model.cfg, dtype=torch.float32)

    def make(layout, session):
        c = draft.cfg
        kv = DraftKVStore(DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim, kv_dtype),
                          session.cache.num_token_slots)
        return DFlashDrafter(tiny_model, draft, layout, kv)

    _, out, _ = _spec(tiny_model, make, mode)
    assert out == reference[0]


@pytest.mark.parametrize("mode", ["replay", "snapshot"])
def test_oracle_full_and_mixed_acceptance(tiny_model, reference, mode):
    """An oracle proposing the target's own tokens, wrong at chosen positions per request."""
    ref = reference[0]
    full = {r: PROMPTS[r] + ref[r] for r in PROMPTS}
    wrong = {0: set(), 1: {len(PROMPTS[1]) + 3, len(PROMPTS[1]) + 12}, 2: {12, 14, 16, 30}}
    make = lambda lay, s: OracleDrafter(8, full, tiny_model.cfg.vocab_size,  # noqa: E731
                                        wrong=lambda row, pos: pos in wrong[row])
    dec, out, _ = _spec(tiny_model, make, mode)
    assert out == ref
    lens = {c for st in dec.stats for c in st.commit_lens}
    assert 8 in lens and len(lens) >= 3, lens  # full accepts and several partial ones
    assert dec.stats[0].commit_lens[0] == 8  # request 0 is never wrong


def test_mtp_draft_state_matches_a_fresh_pass(tiny_model):
    """After cycles, the MTP drafter's next draft equals one from a from-scratch MTP pass."""
    session = Session(tiny_model, len(PROMPTS), MAX_LEN)
    layout = SessionLayout(session)
    dec = SpecDecoder(tiny_model, layout, MTPDrafter(tiny_model, layout, 5))
    reqs = [SpecRequest(row=r, params=PARAMS) for r in PROMPTS]
    dec.start(reqs, list(PROMPTS.values()))
    for _ in range(3):
        dec.step(reqs)
    req = reqs[0]
    tokens = PROMPTS[req.row] + req.output  # the last one is the anchor, not yet committed
    fresh = Session(tiny_model, 1, MAX_LEN)
    hidden = fresh.forward({0: tokens[:req.committed]})[0]
    with torch.inference_mode():
        plan = SessionLayout(fresh).plan([0], [req.committed], [0])
        m = tiny_model.mtp_forward(hidden, torch.tensor(tokens[1:]), plan, fresh.cache)
    assert_close("mtp hidden", m[-1], dec.drafter._hidden[req.row], "fp32_chunk")
    assert dec.drafter._first[req.row] == int(tiny_model.logits(m[-1]).argmax())


def test_dflash_draft_kv_matches_a_fresh_projection(tiny_model, reference, draft_dir):
    draft = load_draft(draft_dir, tiny_model.cfg, dtype=torch.float32)
    c = draft.cfg
    holder = {}

    def make(layout, session):
        holder["kv"] = DraftKVStore(DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim,
                                                  "bf16"), session.cache.num_token_slots)
        holder["layout"] = layout
        return DFlashDrafter(tiny_model, draft, layout, holder["kv"])

    _, out, _ = _spec(tiny_model, make)
    row = 1
    tokens = PROMPTS[row] + out[row]
    n = len(tokens) - 1
    fresh = Session(tiny_model, 1, MAX_LEN)
    with torch.inference_mode():
        plan = SessionLayout(fresh).plan([0], [n], [0])
        _, captured = tiny_model(torch.tensor(tokens[:n]), plan, fresh.cache,
                                 capture_layers=c.target_layer_ids)
        kv = draft.context_kv(torch.cat(captured, -1), torch.arange(n))
    slots = holder["layout"].token_slots(row, 0, n)
    for i, (k, v) in enumerate(kv):
        got_k, got_v = holder["kv"].read(i, slots, torch.float32)
        assert_close("draft k", k.bfloat16().float(), got_k, "bf16")
        assert_close("draft v", v.bfloat16().float(), got_v, "bf16")


def test_indexer_ties_do_not_break_losslessness(tiny_model):
    """This prompt puts exactly tied indexer pools (all heads ReLU'd to 0) in front of a verify
    window starting on a pool boundary: the window must pick what one-token decode picks."""
    prompt = prompt_ids(49, 53)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    for mode in ("replay", "snapshot"):
        report = lossless_check(tiny_model, {0: prompt}, params, SpecConfig(num_steps=7,
                                                                            commit=mode))
        assert report.lossless, report
