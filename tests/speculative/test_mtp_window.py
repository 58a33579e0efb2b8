"""The MTP draft-extend over the verify's whole window (a uniform step, then the MTP layer's indexer
tail rolled to the commit lengths) leaves the drafter where the ragged extend over the committed
prefixes does: same tail, same readable pool keys and latents, same chain start, same drafts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glmlab.core import SamplingParams
from glmlab.model.session import Session
from glmlab.speculative.cycle import SpecDecoder
from glmlab.speculative.layout import SessionLayout
from glmlab.speculative.mtp import MTPDrafter
from glmlab.speculative.types import SpecRequest, TargetStates
from glmlab.speculative.verify import Accepted
from glmlab.testing.compare import assert_close

# Lengths 26, 19, 9: held tail rows 2, 3, 1 (index_kpool 4), so windows of 8 cross pool
# boundaries inside the committed part and inside the garbage part.
PROMPTS = {0: list(range(40, 66)), 1: list(range(100, 119)), 2: [5, 6, 7, 8, 9, 10, 11, 12, 13]}
# Per cycle, per request: commit lengths mixing 1, partial and the full width D = 8.
COMMITS = [[1, 5, 8], [8, 1, 3], [4, 8, 1], [2, 3, 8]]
MAX_LEN = 64
LONG = SamplingParams(max_new_tokens=40, ignore_eos=True)


class RaggedMTP(MTPDrafter):
    """The drafter as callers without a window use it: the ragged extend, always."""

    def extend(self, reqs: list[SpecRequest], states: TargetStates) -> None:
        super().extend(reqs, dataclasses.replace(states, window=None))


class FixedCommits:
    """Acceptance with chosen commit lengths per cycle (in place of ``SimulatedAcceptance``);
    the token after the kept drafts is the target's argmax, as in a real greedy verify."""

    def __init__(self, commits: list[list[int]]):
        self.commits = iter(commits)

    def accept(self, logits: torch.Tensor, drafts: torch.Tensor) -> Accepted:
        n = drafts.shape[0]
        accepted = torch.tensor(next(self.commits), device=drafts.device) - 1
        best = logits.argmax(-1)
        tokens = torch.cat([drafts, best[:, -1:]], dim=1)
        rows = torch.arange(n, device=drafts.device)
        tokens[rows, accepted] = best[rows, accepted]
        return Accepted(accepted, tokens)


def _decoder(model, drafter_cls, num_steps: int, simulate=None):
    session = Session(model, len(PROMPTS), MAX_LEN)
    layout = SessionLayout(session)
    dec = SpecDecoder(model, layout, drafter_cls(model, layout, num_steps), simulate=simulate)
    return dec, layout


def _count_window_commits(dec: SpecDecoder) -> list[int]:
    """Spy on the store: one entry per uniform extend's tail roll (proves the window path ran)."""
    calls, inner = [], dec.store.commit_index_tails

    def spy(cache, slots, lens, layers):
        calls.append(len(layers))
        inner(cache, slots, lens, layers)

    dec.store.commit_index_tails = spy
    return calls


def _assert_same_mtp_state(model, ragged, window, ragged_layout, window_layout, reqs, tag):
    cfg = model.cfg
    layer, kp = cfg.mtp_layer, cfg.dsa.index_kpool
    a, b = ragged_layout.cache, window_layout.cache
    for r in reqs:
        n, held = r.committed, r.committed % kp
        name = f"{tag} row {r.row} (committed {n})"
        assert_close(f"{name} tail", a.index_tail[layer][r.row, :held],
                     b.index_tail[layer][r.row, :held], "fp32_chunk")
        # what a query can read: the pool keys of complete pools, the latents of committed rows
        pools = ragged_layout.token_slots(r.row, 0, n - held)[::kp] // kp
        assert_close(f"{name} pool keys", a.read_pool_keys(layer, pools, torch.float32),
                     b.read_pool_keys(layer, pools, torch.float32), "fp32_chunk")
        slots = ragged_layout.token_slots(r.row, 0, n)
        assert_close(f"{name} latents", a.latent[layer][slots], b.latent[layer][slots],
                     "fp32_chunk")
        m_a, d_a = ragged.drafter.chain_start(r.row)
        m_b, d_b = window.drafter.chain_start(r.row)
        assert_close(f"{name} chain m", m_a, m_b, "fp32_chunk")
        assert d_a == d_b, name


def test_window_extend_matches_the_ragged_extend(tiny_model):
    ragged, ragged_layout = _decoder(tiny_model, RaggedMTP, 7, FixedCommits(COMMITS))
    window, window_layout = _decoder(tiny_model, MTPDrafter, 7, FixedCommits(COMMITS))
    assert window.width == 8 and tiny_model.cfg.dsa.index_kpool == 4
    calls = _count_window_commits(window)
    runs = []
    for dec in (ragged, window):
        reqs = [SpecRequest(row=r, params=LONG) for r in PROMPTS]
        dec.start(reqs, list(PROMPTS.values()))
        runs.append(reqs)
    _assert_same_mtp_state(tiny_model, ragged, window, ragged_layout, window_layout, runs[1],
                           "prompt")
    for cycle, lens in enumerate(COMMITS):
        for dec, reqs in zip((ragged, window), runs, strict=True):
            assert dec.step(reqs).commit_lens == tuple(lens)
        assert [r.committed for r in runs[0]] == [r.committed for r in runs[1]]
        assert [r.output for r in runs[0]] == [r.output for r in runs[1]]  # same drafts kept
        _assert_same_mtp_state(tiny_model, ragged, window, ragged_layout, window_layout, runs[1],
                               f"cycle {cycle}")
    assert calls == [1] * len(COMMITS)  # the ragged extend ran for the prompts only
    # the next chain reads all of it: the drafts agree too
    props = [dec.drafter.propose(reqs).tokens for dec, reqs in zip((ragged, window), runs,
                                                                    strict=True)]
    assert torch.equal(props[0], props[1])


@pytest.mark.parametrize("num_steps", [3, 5])
def test_window_extend_multi_cycle_is_greedy(tiny_model, num_steps):
    """Real greedy acceptance over many cycles: the tokens equal plain greedy decoding, and the
    drafts (hence every commit length) equal those of the ragged extend."""
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = Session(tiny_model, len(PROMPTS), MAX_LEN)
    want = {r: plain.generate(r, p, params) for r, p in PROMPTS.items()}
    ragged, _ = _decoder(tiny_model, RaggedMTP, num_steps)
    window, _ = _decoder(tiny_model, MTPDrafter, num_steps)
    calls = _count_window_commits(window)
    assert ragged.generate(PROMPTS, params) == want
    assert window.generate(PROMPTS, params) == want
    assert len(calls) == len(window.stats) > 1
    assert [s.commit_lens for s in window.stats] == [s.commit_lens for s in ragged.stats]
